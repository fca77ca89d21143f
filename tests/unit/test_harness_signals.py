"""A terminated harness tears down as an interrupted one does.

Cases: SIGTERM to a harness's process group (``make test`` stopped, a CI job cancelled) runs its
teardown (``finally``, atexit) to the end, and a second SIGTERM during that teardown does not cut
it short; a harness running another one (``make matrix`` runs pytest) passes SIGTERM on and waits
for that child's teardown, where ``subprocess.run`` would SIGKILL it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from e2e import waiting

ROOT = Path(__file__).resolve().parents[2]

_TEARS_DOWN = """
import os, pathlib, signal, sys, time
sys.path.insert(0, {root!r})
from e2e import procs
out = pathlib.Path(sys.argv[1])
child = procs.spawn(["sleep", "60"], log_path=out / "sleep.log")
(out / "child.pid").write_text(str(child.pid))
try:
    (out / "ready").write_text("")
    time.sleep(60)
finally:
    (out / "teardown-started").write_text("")
    os.kill(os.getpid(), signal.SIGTERM)  # the second signal, in the middle of the teardown
    time.sleep(0.01)
    procs.stop(child)
    (out / "teardown-done").write_text(str(child.returncode))
"""

_PARENT = """
import sys
sys.path.insert(0, {root!r})
from e2e import procs
procs.run_to_end([sys.executable, "-c", {child!r}, sys.argv[1]], grace_s=60)
"""

_CHILD = """
import pathlib, sys, time
sys.path.insert(0, {root!r})
from e2e import procs
procs.interrupt_on_terminate()
out = pathlib.Path(sys.argv[1])
try:
    (out / "ready").write_text("")
    time.sleep(60)
finally:
    time.sleep(0.5)  # a teardown takes a while: subprocess.run waited 0.25 s, then SIGKILL
    (out / "child-teardown-done").write_text("")
"""


def _start(script: str, out: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], start_new_session=True)
    waiting.wait_for("the harness to start", (out / "ready").exists, timeout=30, every=0.05)
    return proc


def test_sigterm_runs_the_whole_teardown_even_with_a_second_sigterm(tmp_path: Path) -> None:
    proc = _start(_TEARS_DOWN.format(root=str(ROOT)), tmp_path)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        assert (tmp_path / "teardown-started").exists()
        assert (tmp_path / "teardown-done").read_text() == str(-signal.SIGTERM)
        assert not _alive(int((tmp_path / "child.pid").read_text()))
    finally:
        _kill_group(proc)


def test_a_harness_running_a_harness_waits_for_its_teardown(tmp_path: Path) -> None:
    child = _CHILD.format(root=str(ROOT))
    proc = _start(_PARENT.format(root=str(ROOT), child=child), tmp_path)
    try:
        os.kill(proc.pid, signal.SIGTERM)  # the parent alone: it must pass it on
        assert proc.wait(timeout=30) != 0
        assert (tmp_path / "child-teardown-done").exists()
    finally:
        _kill_group(proc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:  # never leak, even when failing
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
