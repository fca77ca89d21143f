"""Child processes that cannot outlive the Python process that started them.

Every component runs in its own session (hence its own process group), so stopping it kills
everything it spawned too (``killpg``). Four layers make sure nothing is left behind:

1. ``stop`` / ``stop_all``: SIGTERM to the group, then SIGKILL after a grace period.
2. ``atexit`` calls ``stop_all``; SIGTERM and SIGHUP (where no handler is set yet) raise
   ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, so a polite kill of the Python
   process unwinds through the same teardown as any error (``finally``, ``with``, atexit): a
   node's ``down()`` kills its pods' containers before its containerd goes, where stopping every
   child at once would leave their shims running. Only the first signal interrupts: a second one
   (make's SIGTERM, then the shell's) must not cut that teardown short.
3. ``PR_SET_PDEATHSIG``: the kernel SIGKILLs a child whose parent dies, even by SIGKILL. The
   "parent" is the *thread* that forked, so it is only set for children started from the main
   thread: a child started from a short-lived worker thread would die with that thread.
4. ``leftover_processes``: a scan of /proc for any process mentioning the harness's work directory,
   used by tests to prove the first three worked.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

_PR_SET_PDEATHSIG = 1
_live: dict[int, subprocess.Popen[bytes]] = {}  # pid (== pgid) -> process
_lock = threading.Lock()
_handlers_installed = False
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child must not load libraries


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(
    argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with stdout+stderr appended to ``log_path``."""
    _install_handlers()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    in_main = threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=_die_with_parent if in_main else None,
        )
    with _lock:
        _live[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen[bytes], *, grace_s: float = 5.0) -> None:
    stop_many([proc], grace_s=grace_s)


def stop_many(procs: Sequence[subprocess.Popen[bytes]], *, grace_s: float = 5.0) -> None:
    """SIGTERM every group at once, wait up to ``grace_s``, SIGKILL what is left, reap."""
    for proc in procs:
        _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        # The leader may be gone while others in its group are not: always kill the group.
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        with _lock:
            _live.pop(proc.pid, None)


def stop_all(*, grace_s: float = 2.0) -> None:
    with _lock:
        procs = list(_live.values())
    if procs:
        stop_many(procs, grace_s=grace_s)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _install_handlers() -> None:
    global _handlers_installed
    with _lock:
        if _handlers_installed:
            return
        _handlers_installed = True
    atexit.register(stop_all)
    interrupt_on_terminate()


_TERMINATE = (signal.SIGTERM, signal.SIGHUP)


def interrupt_on_terminate() -> None:
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt``, where nothing else handles them yet."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    for sig in _TERMINATE:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _interrupt)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    for sig in _TERMINATE:
        if signal.getsignal(sig) is _interrupt:
            # A handler, not SIG_IGN: an ignored signal would stay ignored in every child
            # started during the teardown.
            signal.signal(sig, _during_teardown)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: tearing down")


def _during_teardown(_signum: int, _frame: FrameType | None) -> None:
    pass


def run_to_end(
    argv: Sequence[str], *, timeout: float | None = None, grace_s: float = 300.0, **popen: Any
) -> int:
    """Run a child that tears down what it started (a harness, pytest) and return its exit
    code. Interrupted or timed out, it gets SIGTERM and ``grace_s`` to finish its teardown
    before SIGKILL (``subprocess.run`` kills at once, cutting that teardown short), then the
    interrupt or ``subprocess.TimeoutExpired`` propagates."""
    interrupt_on_terminate()
    with subprocess.Popen(list(argv), **popen) as proc:
        try:
            return proc.wait(timeout=timeout)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.send_signal(signal.SIGTERM)  # once is enough: it ignores a second one
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago (held open together)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a child's log file ("" while it does not exist)."""
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def leftover_processes(marker: str | Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line contains ``marker``."""
    marker = str(marker)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if marker in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found
