"""Time-slicing and MPS applied by prepare, undone by unprepare, repaired by start-up.

A simulated node with the sharing switches on; the runner records the commands (as the
simulated backend's recording runner does) and can be told to fail some, as a GPU that refuses
a setting or an MPS daemon that does not come up would.

Cases:
- a non-Default interval is set on the claimed GPU at prepare and reset at unprepare; Default
  costs no command; a GPU that refuses fails the claim naming the GPU and the tool's output, and
  leaves nothing prepared;
- two claims on one shared GPU: different intervals refused naming the first claim; the same
  interval accepted; the GPU is reset only when the last of them is unprepared;
- MPS: one daemon per claim in the claim's directories, with the claim's limits; the CDI spec
  gives the pipe directory and shm; unprepare quits the daemon and removes its directories; a
  daemon that does not come up fails prepare with its log tail; limits that cannot be applied
  are refused before anything runs;
- a crash between applying and the checkpoint (``after-sharing-applied``): the next start
  resets the GPU and stops the daemon; a prepared claim whose daemon died gets it back;
- switches off: nothing runs (the config reaches the environment only).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_claims import (
    FakeFetcher,
    claim,
    config,
    device_state,
    gpu_config,
    inventory,
    mig_config,
    ref,
    result,
)

from dra_gpu.kubeletplugin.ids import ClaimUID, DeviceName
from dra_gpu.prepare import cdi
from dra_gpu.prepare.cdi_validate import validate_spec
from dra_gpu.prepare.checkpoint import CheckpointStore
from dra_gpu.prepare.sharing import mps
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.sharing.runner import Command, CommandFailed, RecordingRunner
from dra_gpu.prepare.state import DeviceState
from e2e import waiting

INVENTORY = inventory()
GPU = str(INVENTORY["gpu-0"].uuid)
MIG = "gpu-1-mig-1g5gb-19-2"


@dataclass
class Runner:
    """Records commands; ``fail(command)`` returns the output of a failure, or None."""

    commands: list[Command] = field(default_factory=list)
    fail: Callable[[Command], str | None] = lambda command: None

    def run(self, command: Command) -> str:
        self.commands.append(command)
        output = self.fail(command)
        if output is not None:
            raise CommandFailed(command, "exited with 1", output)
        return ""

    def shown(self) -> list[str]:
        """Each command as one line: the control commands' input after the program."""
        return [
            " ".join(c.argv[:1] + c.argv[1:] if c.argv[0] != "unshare" else ("mps-start",))
            + (f" <<< {c.stdin.strip()}" if c.stdin else "")
            for c in self.commands
        ]


class _Crash(BaseException):
    """Stops the transaction like SIGKILL: no except clause of the plugin catches it."""


def sharing_mounts(edits: dict[str, Any]) -> list[dict[str, Any]]:
    """The device's mounts but its device metadata file (every device has that one)."""
    return [
        m for m in edits.get("mounts") or [] if "dra-device-attributes" not in m["containerPath"]
    ]


def crash_at(target: str) -> Callable[[str], None]:
    def fault(step: str) -> None:
        if step == target:
            raise _Crash(step)

    return fault


def sliced(interval: str) -> dict[str, Any]:
    return config(
        gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
    )


def mps_config(**limits: Any) -> dict[str, Any]:
    return config(gpu_config(sharing={"strategy": "MPS", "mpsConfig": limits}))


def mig_mps_config(**limits: Any) -> dict[str, Any]:
    return config(mig_config(sharing={"strategy": "MPS", "mpsConfig": limits}))


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetcher = FakeFetcher()
        self.runner = Runner()

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def state(self, switches: Switches | None = None, **kwargs: Any) -> DeviceState:
        sharing = Sharing(
            runner=self.runner,
            state_dir=self.state_dir,
            switches=switches or Switches(time_slicing=True, mps=True),
        )
        return device_state(
            self.root, devices=INVENTORY, claims=self.fetcher, sharing=sharing, **kwargs
        )

    def spec(self, uid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            cdi.spec_path(self.root / "cdi", ClaimUID(uid)).read_text()
        )
        return data

    def prepared(self) -> set[str]:
        return set(CheckpointStore(self.state_dir).load().claims)


@pytest.fixture
def node(short_tmp: Path) -> Iterator[Node]:
    yield Node(short_tmp)


def set_timeslice(code: int) -> str:
    return f"nvidia-smi compute-policy -i {GPU} --set-timeslice {code}"


def test_interval_set_at_prepare_and_reset_at_unprepare(node: Node) -> None:
    node.fetcher.add(claim("a", [result("gpu-0")], configs=[sliced("Long")]))
    state = node.state()
    assert state.prepare([ref("a")])[ClaimUID("a")].error == ""
    assert node.runner.shown() == [set_timeslice(3)]
    assert state.unprepare([ref("a")]) == {"a": ""}
    assert node.runner.shown() == [set_timeslice(3), set_timeslice(0)]


def test_default_interval_runs_nothing(node: Node) -> None:
    node.fetcher.add(claim("a", [result("gpu-0")]))
    node.fetcher.add(claim("b", [result("gpu-0", share_id="s")], configs=[sliced("Default")]))
    state = node.state()
    assert state.prepare([ref("a")])[ClaimUID("a")].error == ""
    state.unprepare([ref("a")])
    assert state.prepare([ref("b")])[ClaimUID("b")].error == ""
    state.unprepare([ref("b")])
    assert node.runner.commands == []


def test_refused_interval_fails_the_claim_naming_gpu_and_reason(node: Node) -> None:
    node.runner.fail = lambda c: (
        "Setting timeslice is not supported for GPU" if "-i" in c.argv else None
    )
    node.fetcher.add(claim("a", [result("gpu-0")], configs=[sliced("Short")]))
    out = node.state().prepare([ref("a")])[ClaimUID("a")]
    assert "gpu-0" in out.error and GPU in out.error
    assert "refused time-slice interval Short" in out.error
    assert "not supported for GPU" in out.error
    assert out.kind == "SharingError"
    assert node.prepared() == set()
    assert not cdi.spec_path(node.root / "cdi", ClaimUID("a")).exists()


def test_one_interval_per_gpu_and_reset_after_the_last_claim(node: Node) -> None:
    node.fetcher.add(claim("a", [result("gpu-0", share_id="1")], configs=[sliced("Long")]))
    node.fetcher.add(claim("b", [result("gpu-0", share_id="2")], configs=[sliced("Short")]))
    node.fetcher.add(claim("c", [result("gpu-0", share_id="3")], configs=[sliced("Long")]))
    state = node.state()
    assert state.prepare([ref("a")])[ClaimUID("a")].error == ""
    refused = state.prepare([ref("b")])[ClaimUID("b")].error
    assert "runs with time-slice interval Long for claim default/claim-a (a)" in refused
    assert "this claim asks for Short" in refused
    assert state.prepare([ref("c")])[ClaimUID("c")].error == ""
    state.unprepare([ref("a")])
    assert node.runner.shown()[-1] == set_timeslice(3), "c still runs with Long"
    state.unprepare([ref("c")])
    assert node.runner.shown()[-1] == set_timeslice(0)


def test_mps_daemon_per_claim_with_limits_spec_and_stop(node: Node) -> None:
    limits = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "1Gi"}
    node.fetcher.add(claim("m", [result("gpu-0")], configs=[mps_config(**limits)]))
    state = node.state()
    assert state.prepare([ref("m")])[ClaimUID("m")].error == ""
    dirs = mps.claim_dirs(node.state_dir, "m")
    start, control = node.runner.commands
    assert start.argv[-1] == "nvidia-cuda-mps-control" and start.argv[-2] == str(dirs.shm)
    assert start.env == {
        "CUDA_VISIBLE_DEVICES": GPU,
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
    }
    assert control.stdin.splitlines() == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 1024M",
        "get_default_active_thread_percentage",
    ]
    assert dirs.pipe.is_dir() and dirs.shm.is_dir()
    spec = node.spec("m")
    assert validate_spec(spec) == []
    edits = spec["devices"][0]["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    assert [(m["hostPath"], m["containerPath"]) for m in sharing_mounts(edits)] == [
        (str(dirs.pipe), "/tmp/nvidia-mps"),
        (str(dirs.shm), "/dev/shm"),
    ]

    assert state.unprepare([ref("m")]) == {"m": ""}
    assert node.runner.commands[-1].stdin == "quit\n"
    assert node.runner.commands[-1].env["CUDA_MPS_PIPE_DIRECTORY"] == str(dirs.pipe)
    assert not dirs.root.exists()


def test_daemon_that_does_not_come_up_fails_prepare_with_its_log(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mps, "READY_WAIT_S", 0.0)
    dirs = mps.claim_dirs(node.state_dir, "m")

    def fail(command: Command) -> str | None:
        if command.argv[0] == "unshare":
            dirs.log.mkdir(parents=True, exist_ok=True)
            (dirs.log / "control.log").write_text("[2026] Failed to start: no CUDA device\n")
            return None
        return "Cannot find MPS control daemon process"

    node.runner.fail = fail
    node.fetcher.add(claim("m", [result("gpu-0")], configs=[mps_config()]))
    out = node.state().prepare([ref("m")])[ClaimUID("m")]
    assert "MPS control daemon for gpu-0 failed" in out.error
    assert "Cannot find MPS control daemon process" in out.error
    assert "Failed to start: no CUDA device" in out.error, "the daemon's log tail"
    assert node.prepared() == set()
    assert not dirs.root.exists(), "the failed claim's directories are removed"


def test_limits_that_cannot_be_applied_are_refused_before_anything_runs(node: Node) -> None:
    node.fetcher.add(
        claim(
            "m",
            [result("gpu-0")],
            configs=[mps_config(defaultPerDevicePinnedMemoryLimit={"3": "1Gi"})],
        )
    )
    error = node.state().prepare([ref("m")])[ClaimUID("m")].error
    assert "defaultPerDevicePinnedMemoryLimit names '3'" in error
    assert node.runner.commands == []


def test_per_device_limits_by_index_and_uuid() -> None:
    devices = [
        cdi.ClaimDevice(
            name=DeviceName(f"gpu-{i}"),
            type="gpu",
            uuid=f"GPU-{i}",
            minor=i,
            product_name="H200",
            config=gpu_config_model(
                {
                    "defaultPinnedDeviceMemoryLimit": "2Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"1": "512Mi", "GPU-2": "1G"},
                }
            ),
        )
        for i in range(3)
    ]
    assert mps.control_lines(devices) == [
        "set_default_device_pinned_mem_limit 0 2048M",
        "set_default_device_pinned_mem_limit 1 512M",
        "set_default_device_pinned_mem_limit 2 953M",
    ]


def gpu_config_model(limits: dict[str, Any]) -> Any:
    from dra_gpu.config import normalized, parse_opaque_config

    return normalized(
        parse_opaque_config(gpu_config(sharing={"strategy": "MPS", "mpsConfig": limits}))
    )


def test_crash_between_apply_and_checkpoint_is_repaired_at_start(node: Node) -> None:
    node.fetcher.add(claim("t", [result("gpu-0")], configs=[sliced("Medium")]))
    node.fetcher.add(claim("m", [result(MIG)], configs=[mig_mps_config()]))
    for uid in ("t", "m"):
        with pytest.raises(_Crash):
            node.state(fault=crash_at("after-sharing-applied")).prepare([ref(uid)])
    dirs = mps.claim_dirs(node.state_dir, "m")
    assert dirs.root.exists()
    node.runner.commands.clear()

    report = node.state().start()
    assert set(report.rolled_back) == {"t", "m"}
    shown = node.runner.shown()
    assert set_timeslice(0) in shown, "the GPU is back at Default"
    assert "nvidia-cuda-mps-control <<< quit" in shown
    assert not dirs.root.exists()
    assert node.prepared() == set()


def test_start_restarts_the_dead_daemon_of_a_prepared_claim(node: Node) -> None:
    node.fetcher.add(claim("m", [result("gpu-0")], configs=[mps_config()]))
    node.fetcher.add(claim("t", [result(MIG, share_id="x")], configs=[]))
    state = node.state()
    assert state.prepare([ref("m")])[ClaimUID("m")].error == ""
    node.runner.commands.clear()
    dead = [True]

    def fail(command: Command) -> str | None:
        probe = command.stdin == "get_default_active_thread_percentage\n"
        return "Cannot find MPS control daemon process" if probe and dead and dead.pop() else None

    node.runner.fail = fail
    assert node.state().start().problems == ()
    assert [s.split(" <<< ")[0] for s in node.runner.shown()] == [
        set_timeslice(0),  # the GPU no claim asks another interval for: Default
        "nvidia-cuda-mps-control",  # health probe: no answer
        "nvidia-cuda-mps-control",  # quit the remains
        "mps-start",
        "nvidia-cuda-mps-control",  # limits and probe
    ]
    assert mps.claim_dirs(node.state_dir, "m").pipe.is_dir()


def test_switches_off_run_nothing(node: Node) -> None:
    node.fetcher.add(claim("t", [result("gpu-0")], configs=[sliced("Long")]))
    node.fetcher.add(claim("m", [result(MIG)], configs=[mig_mps_config()]))
    state = node.state(switches=Switches())
    out = state.prepare([ref("t"), ref("m")])
    assert [out[ClaimUID(u)].error for u in ("t", "m")] == ["", ""]
    assert (
        "GPU_DEVICE_0_TIMESLICE_INTERVAL=Long"
        in node.spec("t")["devices"][0]["containerEdits"]["env"]
    )
    assert sharing_mounts(node.spec("m")["devices"][0]["containerEdits"]) == []
    state.unprepare([ref("t"), ref("m")])
    state.start()
    assert node.runner.commands == []


def test_process_runner_bounds_each_call(tmp_path: Path) -> None:
    from dra_gpu.prepare.sharing.runner import ProcessRunner

    runner = ProcessRunner(tmp_path)
    assert runner.run(Command(("sh", "-c", "echo out; echo err >&2"))) == "out\nerr\n"
    with pytest.raises(CommandFailed, match=r"timed out after 0.2 s: started"):
        runner.run(Command(("sh", "-c", "echo started; sleep 5"), timeout_s=0.2))
    with pytest.raises(CommandFailed, match=r"exited with 3: why"):
        runner.run(Command(("sh", "-c", "echo why; exit 3")))
    with pytest.raises(CommandFailed, match="cannot run"):
        runner.run(Command(("no-such-tool-here",)))
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    tool = tmp_path / "usr" / "bin" / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho from the driver root $MY_ENV\n")
    tool.chmod(0o755)
    assert runner.run(Command(("nvidia-smi",), env={"MY_ENV": "x"})) == "from the driver root x\n"


def test_exited_daemons_re_parented_to_the_plugin_are_collected(tmp_path: Path) -> None:
    # The plugin as PID 1 of its container, in a fresh interpreter: a subreaper adopts the
    # daemon that ``-d`` forks off, as PID 1 would. A stand-in named like the daemon exits.
    fake = tmp_path / "nvidia-cuda-mps-control"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    code = f"""
import ctypes, os, subprocess, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
subprocess.run(["sh", "-c", "{fake} & {tmp_path}/other-tool &"], check=True)
from dra_gpu.prepare.sharing import mps
time.sleep(0.5)
zombies = lambda: sorted(
    open(f"/proc/{{p}}/stat").read().split(")")[0].split("(")[1]
    for t in os.listdir("/proc/self/task")
    for p in open(f"/proc/self/task/{{t}}/children").read().split()
)
before = zombies()
print(before, mps.reap_exited_daemons(), zombies())
"""
    (tmp_path / "other-tool").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "other-tool").chmod(0o755)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['nvidia-cuda-mps',", "'other-tool']", "1", "['other-tool']"]


def test_switches_from_flags_and_environment() -> None:
    from dra_gpu.plugin.settings import SettingsError, build_settings

    base = {"node_name": "n"}
    off = build_settings(base, {})
    assert (off.time_slicing_settings, off.mps_support) == (False, False)
    on = build_settings({**base, "mps_support": "true"}, {"TIME_SLICING_SETTINGS": "True"})
    assert (on.time_slicing_settings, on.mps_support) == (True, True)
    with pytest.raises(SettingsError, match="--mps-support must be true or false, got 'yes'"):
        build_settings({**base, "mps_support": "yes"}, {})


def test_a_claim_prepared_while_another_on_its_gpu_is_unprepared_keeps_its_interval(
    node: Node,
) -> None:
    # A (Long) is unprepared while B (Long, same shared GPU) is prepared. A's reset decides
    # from the claims it sees; B recorded after that read must not have its Long undone by it.
    node.fetcher.add(claim("a", [result("gpu-0", share_id="1")], configs=[sliced("Long")]))
    node.fetcher.add(claim("b", [result("gpu-0", share_id="2")], configs=[sliced("Long")]))
    state = node.state()
    assert state.prepare([ref("a")])[ClaimUID("a")].error == ""
    done: list[str] = []  # commands in the order they finished
    b_prepare: list[threading.Thread] = []

    def fail(command: Command) -> str | None:
        if command.argv[-1] == "0" and not b_prepare:
            # A's reset is running: B's prepare records its claim, and goes on meanwhile.
            b_prepare.append(threading.Thread(target=state.prepare, args=([ref("b")],)))
            b_prepare[0].start()
            waiting.wait_for("B recorded", lambda: "b" in node.prepared() or None, timeout=10)
            time.sleep(0.3)  # B's apply, unless it waits for A's reset
        done.append(command.argv[-1])
        return None

    node.runner.fail = fail
    assert state.unprepare([ref("a")]) == {"a": ""}
    b_prepare[0].join(timeout=10)
    assert done == ["0", "3"], "the GPU ends with B's interval"


UID = "ed47798a-2e9e-4ef2-829e-68050e46776e"


def test_daemon_sockets_fit_a_socket_path_under_the_kubelets_plugin_dir() -> None:
    # A state dir 49 characters long with the full UID as directory name gave a 109-byte
    # control_privileged socket: the daemon exited 1 on the H200 under the kubelet.
    for state in (
        "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "/tmp/dra-gpu-gpu-node-twi3kaoo/plugin-state",
    ):
        assert mps.socket_problem(mps.claim_dirs(Path(state), UID)) is None
    too_long = mps.claim_dirs(Path("/var/lib/" + "x" * 80), UID)
    problem = mps.socket_problem(too_long)
    assert problem is not None and "use a shorter --state-dir" in problem


def test_a_state_dir_too_long_for_the_sockets_fails_the_start_saying_so(tmp_path: Path) -> None:
    control = mps.MpsControl(RecordingRunner(tmp_path / "commands"), tmp_path / ("x" * 80))
    with pytest.raises(mps.MpsError, match="more than a socket path's 107"):
        control.start(UID, [])
    assert not (tmp_path / "commands").exists()  # nothing was run


def test_daemon_directories_are_found_by_claim_uid_in_both_layouts(short_tmp: Path) -> None:
    control = mps.MpsControl(RecordingRunner(short_tmp / "commands"), short_tmp)
    new = mps.claim_dirs(short_tmp, UID)
    assert new.root.name == mps.claim_key(UID) and len(new.root.name) == 16
    new.pipe.mkdir(parents=True)
    (new.root / "claim-uid").write_text(UID)
    previous = mps.mps_root(short_tmp) / "3f38be09-ac8f-497b-8a10-600af374163c"
    (previous / "pipe").mkdir(parents=True)  # a daemon the previous release started
    assert control.claims() == {UID, previous.name}
    assert mps.claim_dirs(short_tmp, previous.name).root == previous
