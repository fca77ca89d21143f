"""Background supervisors: ``python -m e2e.cluster up`` and ``python -m e2e.demo`` keep an
environment up between shell commands the same way, with this module.

The foreground command starts ``python -m <module> _serve`` detached (its own session, output to a
log file) and follows that log until the supervisor records itself in a state file; the
supervisor owns everything it starts and tears it down on SIGTERM. Invariants:

- A state file names the supervisor's pid; ``alive`` only accepts a pid that still runs
  ``<module>`` and is not a zombie, so a stale file (or a reused pid) reads as "not running".
- The state file appears atomically (written aside, then renamed): a reader never sees half.
- A signal during start-up raises ``SystemExit`` in the supervisor, so its start-up code tears
  down what it started; afterwards a signal only sets ``stopped``.
- The foreground never leaves a half-started supervisor behind: if start-up fails, times out or
  is interrupted (Ctrl-C, SIGTERM, SIGHUP), the supervisor is stopped before the error propagates.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TypeVar

from e2e import procs, waiting

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 60.0  # a supervisor tears a whole cluster down on SIGTERM


class SupervisorExited(RuntimeError):
    """The supervisor exited before it was ready (its log says why)."""


def alive(pid: int, *, module: str) -> bool:
    """``pid`` is still a supervisor started as ``python -m <module>`` (and not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # Guard against pid reuse: it must still be our supervisor, and not a zombie.
    return module.encode() in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def start(module: str, log: Path) -> subprocess.Popen[bytes]:
    """``python -m <module> _serve`` in its own session, writing to ``log``; the repository
    root is importable whatever the caller's working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, "_serve"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def follow(
    proc: subprocess.Popen[bytes],
    log: Path,
    ready: Callable[[], T | None],
    *,
    timeout: float = math.inf,
) -> T:
    """Copy the supervisor's log to stderr until ``ready()`` returns its state, and return that.

    Raises ``SupervisorExited`` if it exits first, ``waiting.WaitTimeout`` after ``timeout``;
    then, and on Ctrl-C or SIGTERM, the supervisor is stopped before the error propagates."""
    procs.interrupt_on_terminate()
    with log.open() as tail:

        def started() -> T | None:
            sys.stderr.write(tail.read())
            state = ready()
            if state is None and proc.poll() is not None:
                sys.stderr.write(tail.read())
                raise SupervisorExited(f"the supervisor exited with code {proc.returncode}")
            return state

        try:
            state = waiting.wait_for(f"the supervisor ({log})", started, timeout=timeout)
        except (waiting.WaitTimeout, KeyboardInterrupt):
            stop(proc.pid, running=lambda: proc.poll() is None)
            raise
        sys.stderr.write(tail.read())
    return state


def stop(pid: int, *, running: Callable[[], bool], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the supervisor; SIGKILL its process group if ``running()`` still holds after
    ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        waiting.wait_for(f"pid {pid} to exit", lambda: not running(), timeout=grace, every=0.1)
    except waiting.WaitTimeout:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def write_state(path: Path, state: Mapping[str, object]) -> None:
    """Record the ready supervisor; readers see the whole file or none."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)


class StopSignals:
    """SIGTERM, SIGINT and SIGHUP for a supervisor: during start-up they raise ``SystemExit`` (the
    start-up code tears down what it started); once ``ready`` is set they only set ``stopped``."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.ready = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopped.set()
        if not self.ready:
            raise SystemExit(128 + signum)
