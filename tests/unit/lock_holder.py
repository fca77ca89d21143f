"""A lock file held by another process, as another plugin instance (or a stuck one) holds it."""

from __future__ import annotations

import contextlib
import select
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

# The other instance of ``call_lock``'s protocol, written out with plain flock calls: it holds
# the turnstile while it waits for the lock, and lets it go once it has the lock.
_WAIT_TURN = """
import fcntl, os, sys
lock = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
turnstile = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(turnstile, fcntl.LOCK_EX)
print("waiting", flush=True)
fcntl.flock(lock, fcntl.LOCK_EX)
fcntl.flock(turnstile, fcntl.LOCK_UN)
print("held", flush=True)
sys.stdin.read()  # until the test closes its end
"""


@contextlib.contextmanager
def held_by_another_process(path: Path) -> Iterator[int]:
    """Hold ``path``'s flock in a child process for the block; yields the child's PID."""
    with _child(_HOLD, path) as child:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        yield child.pid


class TurnWaiter:
    """A child process waiting for its turn at ``path`` through ``turnstile``."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child

    def says(self, word: str, timeout_s: float) -> bool:
        """Whether the child printed ``word`` (its next line) within ``timeout_s``."""
        assert self.child.stdout is not None
        ready, _, _ = select.select([self.child.stdout], [], [], timeout_s)
        # Unbuffered: a line read here never takes the next one with it, unseen by select.
        return bool(ready) and self.child.stdout.readline() == f"{word}\n".encode()


@contextlib.contextmanager
def waiting_in_another_process(path: Path, turnstile: Path) -> Iterator[TurnWaiter]:
    """A child that takes ``turnstile``, waits for ``path``, lets the turnstile go, holds
    ``path`` until the block ends; yields once it waits (holds the turnstile)."""
    with _child(_WAIT_TURN, path, turnstile) as child:
        waiter = TurnWaiter(child)
        assert waiter.says("waiting", 30)
        yield waiter


@contextlib.contextmanager
def _child(script: str, *paths: Path) -> Iterator[subprocess.Popen[bytes]]:
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, paths)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    try:
        yield child
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:  # still waiting for the lock: the test failed
            child.kill()
            child.wait(10)
