"""Run another kubelet plugin in place of a node's usual one for the length of a test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from e2e.driver import PluginProcess


@contextlib.contextmanager
def replacing(usual: PluginProcess, replacement: PluginProcess) -> Iterator[PluginProcess]:
    """Stop ``usual``, run ``replacement`` until the kubelet registered it; afterwards stop it
    and bring ``usual`` back (registered again), whatever the test did."""
    registered = usual.registrations()
    usual.stop()
    try:
        replacement.start()
        replacement.wait_registered(after=registered)
        yield replacement
    finally:
        replacement.stop()
        # Counted now: the log holds earlier registrations (the usual plugin's and the
        # replacement's), and a wait "after 0" returned before the restarted plugin served.
        before = usual.registrations()
        usual.start()
        usual.wait_registered(after=before)
