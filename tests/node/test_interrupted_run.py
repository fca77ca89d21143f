"""A run stopped mid-way (``make test`` or ``make e2e-deployed`` terminated, or killed) leaves
nothing on the host once the next run has started.

The run (``interrupted_run.py``) has a control plane and a real node in the deployed kit's root
layout, with a pod running. Its process group gets SIGTERM (its own teardown must stop the pod's
containers before containerd, and leave nothing even before the next run) or SIGKILL (no teardown
at all: the next run's start must find the node's record and remove it all). What is checked is
what the node's record names, never a process name: processes whose arguments name its containerd
socket (the shims), processes in its cgroup, mounts under its root, its network links.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e import procs, waiting
from e2e.deployed.env import nodes_root
from e2e.node.cleanup import (
    NodeRecord,
    cgroup_hierarchies,
    cgroup_pids,
    mounts_under,
    pids_with_arg,
    reap_stale,
    record_path,
    registered,
)

RUN = Path(__file__).resolve().parent / "interrupted_run.py"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Left:
    shims: list[int]
    cgroup_processes: set[int]
    cgroups: list[Path]
    mounts: list[str]
    links: list[str]
    registered: bool


def left_of(record: NodeRecord) -> Left:
    cgroups = [d for h in cgroup_hierarchies() if (d := h / record.cgroup.lstrip("/")).is_dir()]
    mountinfo = Path("/proc/self/mountinfo").read_text()
    return Left(
        shims=pids_with_arg(record.containerd_socket),
        cgroup_processes=set().union(*(cgroup_pids(d) for d in cgroups)),
        cgroups=cgroups,
        mounts=mounts_under(Path(record.root), mountinfo),
        links=[link for link in record.links if Path("/sys/class/net", link).exists()],
        registered=record_path(record.root).exists(),
    )


NOTHING = Left([], set(), [], [], [], registered=False)


def _wait_gone(record: NodeRecord) -> Left:
    # A SIGKILLed process leaves /proc a moment after kill() returns.
    with contextlib.suppress(waiting.WaitTimeout):
        waiting.wait_for("the leftovers to go", lambda: left_of(record) == NOTHING, timeout=10)
    return left_of(record)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_run_stopped_mid_way_leaves_nothing_once_the_next_one_started(
    sig: signal.Signals,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a real node (containerd, runc, kubelet, cgroups, mounts) needs root")
    workdir = Path(tempfile.mkdtemp(prefix="dra-gpu-interrupted-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(workdir / "run.log", "wb") as log:
        run = subprocess.Popen(
            [sys.executable, str(RUN), str(workdir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:

        def pod_running() -> str | None:
            if run.poll() is not None:
                raise RuntimeError(f"the run exited: {procs.log_tail(workdir / 'run.log')}")
            marker = workdir / "node-root"
            return marker.read_text() if marker.exists() else None

        root = waiting.wait_for("the run's pod to run", pod_running, timeout=600)
        (record,) = [r for r in registered() if r.root == root]
        assert record.owner_pid == run.pid
        assert Path(root).parent == nodes_root(workdir)
        before = left_of(record)
        assert before.shims and before.cgroup_processes and before.mounts, before
        assert len(before.links) == len(record.links) == 2 and before.registered, before

        os.killpg(run.pid, sig)
        run.wait(timeout=180)
        if sig == signal.SIGTERM:  # the run's own teardown, as at the end of a normal run
            assert _wait_gone(record) == NOTHING, procs.log_tail(workdir / "run.log")
        else:
            assert left_of(record).shims, "SIGKILL: the shims outlive the run, to be reaped"
        reaped = reap_stale()  # what the next run's start does
        assert (root in reaped) == (sig == signal.SIGKILL)
        assert _wait_gone(record) == NOTHING
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        reap_stale()  # never leak, even when failing
        shutil.rmtree(nodes_root(workdir), ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
