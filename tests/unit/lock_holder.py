"""A lock file held by another process, as another plugin instance (or a stuck one) holds it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes its end
"""


@contextlib.contextmanager
def held_by_another_process(path: Path) -> Iterator[int]:
    """Hold ``path``'s flock in a child process for the block; yields the child's PID."""
    path.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        yield child.pid
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
