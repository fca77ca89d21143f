"""Run another kubelet plugin in place of a node's usual one for the length of a test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from e2e.driver import PluginProcess


@contextlib.contextmanager
def replacing(usual: PluginProcess, replacement: PluginProcess) -> Iterator[PluginProcess]:
    """Stop ``usual``, run ``replacement`` until the kubelet registered it; afterwards stop it
    and bring ``usual`` back (registered), whatever the test did."""
    registered = usual.registrations()
    usual.stop()
    try:
        replacement.start()
        replacement.wait_registered(after=registered)
        yield replacement
    finally:
        replacement.stop()
        usual.start()
        usual.wait_registered(after=0)
