"""GPU sharing applied on a real node (kubelet + containerd, simulated GPUs): the plugin with
``--time-slicing-settings true --mps-support true`` runs in place of ``gpu-h200``'s usual one.
The simulated backend records the ``nvidia-smi`` / ``nvidia-cuda-mps-control`` commands a real
GPU would get (``<state dir>/sharing-commands.jsonl``); the tests read that sequence.

Cases:
- a pod with a time-sliced claim (``Long``): the plugin is SIGKILLed between applying the
  interval and recording the claim completed; restarted, it resets the GPU to Default, the
  kubelet's retry sets ``Long`` again and the pod runs; deleting the pod resets the GPU;
- two pods sharing one claim with MPS: both get the same pipe directory and shm (each sees the
  file the other wrote), the limits in their environment; the daemon of the claim was started
  once with the claim's GPU and limits, and is stopped (its directories removed) after the last
  pod is gone.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_swap import replacing

from dra_gpu.prepare.cdi import env_prefix
from dra_gpu.prepare.checkpoint import PREPARE_STARTED, CheckpointStore
from dra_gpu.prepare.sharing import mps
from dra_gpu.prepare.sharing.applied import recording_path
from dra_gpu.prepare.sharing.runner import Command, recorded
from e2e import waiting
from e2e.cluster import Cluster
from e2e.driver import Driver, PluginProcess
from e2e.node.kubelet_node import Node
from e2e.suite import runner
from e2e.suite.runner import Context, Run, Scenario
from e2e.suite.scenarios import BY_NAME, one_device_shared

NODE = "gpu-h200"
SCENARIOS = Path(__file__).resolve().parent / "sharing_scenarios"
FAULT = "after-sharing-applied"


@pytest.fixture
def plugin(
    cluster: Cluster, real_nodes: dict[str, Node], driver: Driver
) -> Iterator[PluginProcess]:
    sharing = PluginProcess.for_node(
        real_nodes[NODE],
        kubeconfig=cluster.kubeconfig,
        profile="h200x8",
        extra=["--time-slicing-settings", "true", "--mps-support", "true"],
    )
    record = recording_path(sharing.dirs.state)
    with replacing(driver.plugins[NODE], sharing):
        yield sharing
    record.unlink(missing_ok=True)


def on_node(ctx: Context) -> Context:
    return dataclasses.replace(
        ctx, node_selector={**ctx.node_selector, "kubernetes.io/hostname": NODE}
    )


def commands(plugin: PluginProcess, since: int = 0) -> list[Command]:
    return recorded(recording_path(plugin.dirs.state))[since:]


def timeslices(cmds: list[Command]) -> list[tuple[str, str]]:
    """(GPU UUID, interval code) of each ``--set-timeslice`` command."""
    return [(c.argv[3], c.argv[5]) for c in cmds if "--set-timeslice" in c.argv]


# The crash tests' launcher: the shipped program has no failpoints (tests/cluster/crash_plugin.py).
CRASH_PLUGIN = str(Path(__file__).resolve().parents[1] / "cluster" / "crash_plugin.py")


def restart(plugin: PluginProcess, *, fault: str | None) -> None:
    """Restart the plugin as ``python -m dra_gpu ...``, or through the crash launcher that
    SIGKILLs it at ``fault``."""
    registered = plugin.registrations()
    plugin.stop()
    if plugin.argv[1] == CRASH_PLUGIN:
        plugin.argv[1:3] = ["-m", "dra_gpu"]
    if fault:
        assert plugin.argv[1:3] == ["-m", "dra_gpu"], plugin.argv
        plugin.argv[1:3] = [CRASH_PLUGIN, fault]
    plugin.start()
    plugin.wait_registered(after=registered)


def test_interval_set_reset_and_repaired_after_sigkill_between_apply_and_checkpoint(
    suite: Context, plugin: PluginProcess
) -> None:
    ctx = on_node(suite)
    restart(plugin, fault=FAULT)
    mark = len(commands(plugin))
    started: dict[str, tuple[Run, list[str]]] = {}
    thread = threading.Thread(
        target=lambda: started.update(out=runner.start(ctx, BY_NAME["gpu-config"])), daemon=True
    )
    thread.start()
    try:
        waiting.wait_for(
            "the plugin to SIGKILL itself", lambda: not plugin.alive or None, timeout=120
        )
        assert f"SIGKILL at {FAULT}" in plugin.log_tail(200)
        [(gpu, code)] = timeslices(commands(plugin, mark))
        assert code == "3", "Long was applied before the kill"
        states = [r.state for r in CheckpointStore(plugin.dirs.state).load().claims.values()]
        assert states == [PREPARE_STARTED], "killed before the claim was recorded completed"

        mark = len(commands(plugin))
        restart(plugin, fault=None)
        thread.join(timeout=ctx.timeout + 60)
        run, problems = started["out"]
    finally:
        if not plugin.alive:
            restart(plugin, fault=None)
        thread.join(timeout=ctx.timeout + 60)
    try:
        assert not problems, problems
        after = timeslices(commands(plugin, mark))
        # Start-up repair: no completed claim asks an interval, so every GPU is Default (the
        # killed prepare's Long is undone); then the kubelet's retry sets Long again.
        assert (gpu, "0") in after and after[-1] == (gpu, "3"), after
        assert after.index((gpu, "0")) < len(after) - 1
    finally:
        mark = len(commands(plugin))
        problems = runner.finish(ctx, run)
    assert not problems, problems
    assert timeslices(commands(plugin, mark)) == [(gpu, "0")], "unprepare resets the GPU"


def test_two_pods_sharing_an_mps_claim_meet_in_its_pipe_directory(
    suite: Context, plugin: PluginProcess
) -> None:
    ctx = dataclasses.replace(on_node(suite), scenarios_dir=SCENARIOS)
    scenario = Scenario("mps-shared-by-pods", "one MPS claim, two pods", (one_device_shared,))
    mark = len(commands(plugin))
    run, problems = runner.start(ctx, scenario)
    try:
        assert not problems, problems
        [claim] = run.claims.values()
        dirs = mps.claim_dirs(plugin.dirs.state, claim["metadata"]["uid"])
        assert sorted(c.pod for c in run.containers) == ["mps-1", "mps-2"]
        for container in run.containers:
            env = container.view.env
            [device] = container.devices
            prefix = env_prefix(device)
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
            assert env["MPS_PIPE_LISTING"].split() == ["seen-by-mps-1", "seen-by-mps-2"]
            assert env["SHM_LISTING"].split() == ["shm-of-mps-1", "shm-of-mps-2"]
            assert env[f"{prefix}_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
            assert env[f"{prefix}_MPS_PINNED_DEVICE_MEMORY_LIMIT"] == "10Gi"
            uuid = env[f"{prefix}_UUID"]
        assert sorted(p.name for p in dirs.pipe.iterdir()) == ["seen-by-mps-1", "seen-by-mps-2"]
        [start] = [c for c in commands(plugin, mark) if c.argv[0] == "unshare"]
        assert start.env == {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        }
        controls = [c.stdin.splitlines() for c in commands(plugin, mark) if c.stdin]
        assert controls == [
            [
                "set_default_active_thread_percentage 50",
                "set_default_device_pinned_mem_limit 0 10240M",
                "get_default_active_thread_percentage",
            ]
        ]
    finally:
        mark = len(commands(plugin))
        problems = runner.finish(ctx, run)
    assert not problems, problems
    assert [(c.stdin, c.env["CUDA_MPS_PIPE_DIRECTORY"]) for c in commands(plugin, mark)] == [
        ("quit\n", str(dirs.pipe))
    ]
    assert not dirs.root.exists()
