"""The harness's locked daemons (dockerd, kube-proxy): a daemon that dies while starting fails the
start at once with its own words, and gives the lock back for the next one."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from e2e.locked_daemon import LockedDaemon


def _lock_is_free(path: Path) -> bool:
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
    return True


def test_a_daemon_that_exits_while_starting_fails_with_its_log(tmp_path: Path) -> None:
    daemon = LockedDaemon("d", lock_path=tmp_path / "lock", log_path=tmp_path / "d.log")
    with pytest.raises(RuntimeError, match=r"(?s)d exited with 3.*no config found"):
        daemon.start(
            ["sh", "-c", "echo no config found; exit 3"],
            ready=lambda: False,
            what="d to answer",
            timeout=30,
        )
    assert _lock_is_free(tmp_path / "lock")


def test_the_lock_is_held_while_the_daemon_runs(tmp_path: Path) -> None:
    daemon = LockedDaemon("d", lock_path=tmp_path / "lock", log_path=tmp_path / "d.log")
    daemon.start(["sleep", "30"], ready=lambda: True, what="d", timeout=5)
    try:
        assert not _lock_is_free(tmp_path / "lock")
    finally:
        daemon.stop(grace_s=0.0)
    assert _lock_is_free(tmp_path / "lock")
    daemon.stop()  # idempotent


def test_leftovers_of_a_killed_instance_are_removed_under_the_lock(tmp_path: Path) -> None:
    # A killed dockerd leaves its build containers' shims: the next holder of the lock removes
    # them before its own start, and each stop after its daemon is gone, never while another
    # holder's daemon runs.
    lock = tmp_path / "lock"
    held: list[bool] = []
    daemon = LockedDaemon(
        "d",
        lock_path=lock,
        log_path=tmp_path / "d.log",
        leftovers=lambda: held.append(not _lock_is_free(lock)),
    )
    daemon.start(["sleep", "30"], ready=lambda: True, what="d", timeout=5)
    assert held == [True]
    daemon.stop(grace_s=0.0)
    assert held == [True, True]
    daemon.stop()
    assert held == [True, True]  # nothing stopped, nothing to remove
