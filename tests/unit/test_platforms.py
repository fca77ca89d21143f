"""One choice of platform decides every difference between a real and a simulated node.

Cases: a simulated node records sharing commands instead of running them, keeps MIG instances in
its state directory, builds CDI specs with stand-in device nodes, and re-discovers only from a
profile file; an NVML node runs the commands, creates MIG devices through NVML, reads its driver
files, and re-discovers on the interval (two passes must agree) unless it is switched off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu.mig.instances import SimulatedInstances
from dra_gpu.mig.nvml_instances import NvmlInstances
from dra_gpu.plugin import platforms
from dra_gpu.prepare import node_facts
from dra_gpu.prepare.sharing.runner import ProcessRunner, RecordingRunner


def test_a_simulated_node_touches_no_gpu(tmp_path: Path) -> None:
    platform = platforms.for_node(simulate="h200x8", node_name="n")
    assert platform.simulated
    assert isinstance(platform.runner(tmp_path), RecordingRunner)
    assert isinstance(platform.mig_instances(tmp_path), SimulatedInstances)
    assert platform.node_facts() is node_facts.simulated
    assert platform.rediscovery(60.0) is None  # a built-in profile never changes
    assert len(platform.backend().discover().gpus) == 8


def test_a_profile_file_is_watched(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("gpus:\n  - product: H200-141GB\n    count: 2\n")
    how = platforms.for_node(simulate=str(path), node_name="n").rediscovery(None)
    assert how is not None and how.changed_file == path and how.confirm == 1


@pytest.mark.parametrize(
    ("interval", "expected"), [(60.0, (60.0, 2)), (None, None), (0.0, None)], ids=str
)
def test_an_nvml_node_rediscovers_on_its_interval(
    interval: float | None, expected: tuple[float, int] | None
) -> None:
    how = platforms.for_node(simulate=None, node_name="n").rediscovery(interval)
    assert (how and (how.interval_s, how.confirm)) == expected


def test_an_nvml_node_runs_its_tools_under_the_driver_root(tmp_path: Path) -> None:
    platform = platforms.for_node(simulate=None, node_name="n", driver_root=tmp_path)
    assert not platform.simulated
    runner = platform.runner(tmp_path)
    assert isinstance(runner, ProcessRunner) and runner.driver_root == tmp_path
    assert isinstance(platform.node_facts(), node_facts.HostNode)
    assert isinstance(platform.mig_instances(tmp_path), NvmlInstances)
