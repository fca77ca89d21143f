"""``python -m e2e.cluster {up,down,env,logs}``: a cluster that stays up between shell commands.

``up`` builds any missing binary first (its ``--timeout`` starts after that), then starts a
detached supervisor (``python -m e2e.cluster _serve``, its own session) that owns the ``Cluster``
object and tears it down on SIGTERM; the components die with it (parent-death signal) even if it
is SIGKILLed. The supervisor records itself in ``<cache>/cluster/state.json`` once the cluster is
ready; ``up`` follows the supervisor's log meanwhile and prints ``export KUBECONFIG=<path>`` as its
last line, so ``eval "$(python -m e2e.cluster up)"`` works.
``down`` stops the supervisor and removes any process that still mentions the work directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from e2e import binaries, procs, supervisor, waiting
from e2e.cluster.control_plane import Cluster

MODULE = "e2e.cluster"


class ClusterState(TypedDict):
    """``state.json``: what the supervisor records once its cluster is ready."""

    pid: int
    workdir: str
    kubeconfig: str
    server: str
    started: str  # UTC, ISO 8601


def state_dir() -> Path:
    """Where the running cluster is recorded (``$DRA_GPU_CLUSTER_STATE`` overrides)."""
    override = os.environ.get("DRA_GPU_CLUSTER_STATE")
    return Path(override) if override else binaries.cache_root() / "cluster"


def _state_file() -> Path:
    return state_dir() / "state.json"


def _supervisor_log() -> Path:
    return state_dir() / "supervisor.log"


def _alive(pid: int) -> bool:
    return supervisor.alive(pid, module=MODULE)


def read_state() -> ClusterState | None:
    """The running cluster's state, or None when none is running."""
    try:
        state: ClusterState = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(int(state.get("pid", 0))) else None


def _export_line(state: ClusterState) -> str:
    return f"export KUBECONFIG={state['kubeconfig']}"


def cmd_up(args: argparse.Namespace) -> int:
    state = read_state()
    if state is not None:
        print(f"a cluster is already running at {state['server']}", file=sys.stderr)
        print(_export_line(state))
        return 0
    # Build first, here: --timeout is for the cluster to start, and a cold build takes minutes.
    binaries.ensure(binaries.CONTROL_PLANE)
    _state_file().unlink(missing_ok=True)
    log = _supervisor_log()
    proc = supervisor.start(MODULE, log)
    start = time.monotonic()
    try:
        state = supervisor.follow(proc, log, read_state, timeout=args.timeout)
    except supervisor.SupervisorExited:
        print(f"cluster failed to start (supervisor log: {log})", file=sys.stderr)
        return 1
    except waiting.WaitTimeout:
        print(f"cluster not ready after {args.timeout}s (log: {log})", file=sys.stderr)
        return 1
    print(f"cluster ready at {state['server']} in {time.monotonic() - start:.1f}s", file=sys.stderr)
    print(_export_line(state))
    return 0


def cmd_serve(_: argparse.Namespace) -> int:
    signals = supervisor.StopSignals()  # until ready, a signal interrupts up(): it tears down
    cluster = Cluster(log=lambda line: print(line, flush=True))
    print(f"work directory: {cluster.workdir}", flush=True)
    try:
        cluster.up()
    except Exception as exc:
        print(f"cluster failed to start: {exc}", flush=True)
        return 1
    signals.ready = True
    state: ClusterState = {
        "pid": os.getpid(),
        "workdir": str(cluster.workdir),
        "kubeconfig": str(cluster.kubeconfig),
        "server": cluster.server,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    supervisor.write_state(_state_file(), state)
    print(f"ready: {cluster.server}", flush=True)
    signals.stopped.wait()
    print("stopping", flush=True)
    cluster.down()
    _state_file().unlink(missing_ok=True)
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    try:
        state: ClusterState = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        print("no cluster is running", file=sys.stderr)
        return 0
    pid = int(state["pid"])
    if _alive(pid):
        supervisor.stop(pid, running=lambda: _alive(pid), grace=30)
    for leftover, _cmd in procs.leftover_processes(state["workdir"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)
    shutil.rmtree(state["workdir"], ignore_errors=True)
    _state_file().unlink(missing_ok=True)
    print("cluster stopped", file=sys.stderr)
    return 0


def cmd_env(_: argparse.Namespace) -> int:
    state = read_state()
    if state is None:
        print("no cluster is running; start one with: python -m e2e.cluster up", file=sys.stderr)
        return 1
    print(_export_line(state))
    return 0


def cmd_logs(_: argparse.Namespace) -> int:
    state = read_state()
    if state is None:
        print("no cluster is running", file=sys.stderr)
        return 1
    for path in sorted((Path(state["workdir"]) / "logs").glob("*.log")):
        print(f"===== {path}")
        print(procs.log_tail(path))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.cluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster in the background; prints export KUBECONFIG=")
    up.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to be ready, after any build"
    )
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop the background cluster").set_defaults(func=cmd_down)
    sub.add_parser("env", help="print export KUBECONFIG= again").set_defaults(func=cmd_env)
    sub.add_parser("logs", help="tail of each component's log").set_defaults(func=cmd_logs)
    sub.add_parser("_serve").set_defaults(func=cmd_serve)  # the supervisor; not for users
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `... logs | head`
        sys.stderr.close()
        return 0
