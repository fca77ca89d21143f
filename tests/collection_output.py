"""Output of builds started at collection time (conftest ``pytest_collection_finish`` hooks).

Each tier builds what it needs (Kubernetes binaries, helm, node packages) after collection and
before any test runs, so that no test's timeout pays for a cold build. Such a build can take
minutes, so its progress goes straight to the terminal: output capture is off while it runs.
Importable from every conftest: the root ``tests/conftest.py`` is loaded first and pytest puts
its directory (``tests/``) on ``sys.path``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest


@contextlib.contextmanager
def terminal_log(session: pytest.Session) -> Iterator[Callable[[str], None]]:
    """Capture off for the ``with`` block; yields a function that writes one line to the
    terminal."""
    capture = session.config.pluginmanager.get_plugin("capturemanager")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def log(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    # No capture manager when pytest runs with `-p no:capture`: the output goes out as it is.
    disabled = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with disabled:
        yield log
