"""``python -m e2e.cluster {up,down,env,logs}``: a cluster that stays up between shell commands.

``up`` starts a detached supervisor (``python -m e2e.cluster _serve``, its own session) that owns
the ``Cluster`` object and tears it down on SIGTERM; the components die with it (parent-death
signal) even if it is SIGKILLed. The supervisor records itself in ``<cache>/cluster/state.json``
once the cluster is ready; ``up`` follows the supervisor's log meanwhile and prints
``export KUBECONFIG=<path>`` as its last line, so ``eval "$(python -m e2e.cluster up)"`` works.
``down`` stops the supervisor and removes any process that still mentions the work directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from e2e import binaries, procs
from e2e.cluster import Cluster

REPO_ROOT = Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    """Where the running cluster is recorded (``$DRA_GPU_CLUSTER_STATE`` overrides)."""
    override = os.environ.get("DRA_GPU_CLUSTER_STATE")
    return Path(override) if override else binaries.cache_root() / "cluster"


def _state_file() -> Path:
    return state_dir() / "state.json"


def _supervisor_log() -> Path:
    return state_dir() / "supervisor.log"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # Guard against pid reuse: it must still be our supervisor, and not a zombie.
    return b"e2e.cluster" in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_state() -> dict[str, Any] | None:
    """The running cluster's state, or None when none is running."""
    try:
        state: dict[str, Any] = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(int(state.get("pid", 0))) else None


def _export_line(state: dict[str, Any]) -> str:
    return f"export KUBECONFIG={state['kubeconfig']}"


def cmd_up(args: argparse.Namespace) -> int:
    state = read_state()
    if state is not None:
        print(f"a cluster is already running at {state['server']}", file=sys.stderr)
        print(_export_line(state))
        return 0
    state_dir().mkdir(parents=True, exist_ok=True)
    _state_file().unlink(missing_ok=True)
    log = _supervisor_log()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "e2e.cluster", "_serve"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    start = time.monotonic()
    with log.open() as follow:
        while (state := read_state()) is None:
            sys.stderr.write(follow.read())
            if proc.poll() is not None:
                sys.stderr.write(follow.read())
                print(f"cluster failed to start (supervisor log: {log})", file=sys.stderr)
                return 1
            if time.monotonic() - start > args.timeout:
                os.killpg(proc.pid, signal.SIGTERM)
                print(f"cluster not ready after {args.timeout}s (log: {log})", file=sys.stderr)
                return 1
            time.sleep(0.2)
        sys.stderr.write(follow.read())
    print(f"cluster ready at {state['server']} in {time.monotonic() - start:.1f}s", file=sys.stderr)
    print(_export_line(state))
    return 0


def cmd_serve(_: argparse.Namespace) -> int:
    stop = threading.Event()
    ready = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        if not ready:  # interrupt up(): it tears down what it started
            raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    cluster = Cluster(log=lambda line: print(line, flush=True))
    print(f"work directory: {cluster.workdir}", flush=True)
    try:
        cluster.up()
    except Exception as exc:
        print(f"cluster failed to start: {exc}", flush=True)
        return 1
    ready = True
    state = {
        "pid": os.getpid(),
        "workdir": str(cluster.workdir),
        "kubeconfig": str(cluster.kubeconfig),
        "server": cluster.server,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, _state_file())
    print(f"ready: {cluster.server}", flush=True)
    stop.wait()
    print("stopping", flush=True)
    cluster.down()
    _state_file().unlink(missing_ok=True)
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    try:
        state: dict[str, Any] = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        print("no cluster is running", file=sys.stderr)
        return 0
    pid = int(state["pid"])
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
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
        print("\n".join(path.read_text(errors="replace").splitlines()[-40:]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.cluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster in the background; prints export KUBECONFIG=")
    up.add_argument("--timeout", type=float, default=3600.0, help="seconds (includes any build)")
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
