"""Consumable shares: the published shape, share-keyed records, limits and crash recovery.

Cases:
- each share mode (memory, unlimited, an integer, with and without compute) publishes a full GPU
  and a MIG device with ``allowMultipleAllocations`` and NVIDIA's request policies (table);
  memory rounded down to a whole MiB; capacities of 0 without a policy; off: no change;
- the mode from the flag or the environment; a bad one refused naming the choices;
- two claims on one GPU are two records, each with its share ID and consumed amounts; a share
  that does not fit beside the recorded ones is refused naming the claims that hold the device;
  two requests of one claim on one device are one share of their sum; unprepare frees exactly
  its share (the next claim fits);
- with MPS switched on each share gets a daemon of its own, limited to its consumed memory and
  compute before its server starts; a lower limit of the claim's own MPS config is kept; a
  time-slicing config on a share sets no interval on the GPU; a share that consumed nothing
  runs no daemon;
- a crash at each step of a share's prepare or unprepare, then a restart: the daemons match
  the records (the crashed share's stopped or restarted with its limits, the other share's
  untouched), the repeated call succeeds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_claims import FakeFetcher, claim, config, device_state, gpu_config, inventory, ref

from dra_gpu.devices import shares
from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin import slices
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.plugin import published
from dra_gpu.plugin.settings import SettingsError, build_settings
from dra_gpu.prepare.checkpoint import CheckpointStore
from dra_gpu.prepare.sharing import mps
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.sharing.runner import RecordingRunner, recorded
from dra_gpu.prepare.state import FAULT_STEPS, SIDE_EFFECT_FAULT_STEPS, DeviceState

INVENTORY = inventory()  # gpu-0: a full A100 of 40Gi; gpu-1..3: MIG devices
MIG = "gpu-1-mig-1g5gb-19-2"
MIB = 1024**2
GI = 1024**3


def odd_gpu() -> Device:
    """gpu-0 with memory that is not a whole number of MiB (as NVML reports some GPUs)."""
    from dataclasses import replace
    from types import MappingProxyType

    gpu = INVENTORY["gpu-0"]
    return replace(gpu, capacity=MappingProxyType({"memory": 40 * GI + 123}))


def published_device(device: Device, mode: str, *, compute: bool = False) -> dict[str, Any]:
    share_mode = shares.parse_mode(mode, compute=compute)
    (one,) = published.node_slices(
        [device], driver_name="gpu.nvidia.com", node_name="n", node_uid=None, shares=share_mode
    )
    (out,) = one["spec"]["devices"]
    return dict(out)


def policy(default: str, lo: str, hi: str, step: str | None = None) -> dict[str, Any]:
    valid = {"min": lo, "max": hi} | ({"step": step} if step else {})
    return {"default": default, "validRange": valid}


@pytest.mark.parametrize(
    ("device", "mode", "compute", "capacity"),
    [
        pytest.param(
            "gpu-0",
            "memory",
            False,
            {"memory": {"value": "40Gi", "requestPolicy": policy("40Gi", "1Mi", "40Gi", "1Mi")}},
            id="gpu-memory",
        ),
        pytest.param(
            "gpu-0",
            "unlimited",
            False,
            {"memory": {"value": "40Gi", "requestPolicy": policy("0", "0", "40Gi", "1Mi")}},
            id="gpu-unlimited",
        ),
        pytest.param(
            "gpu-0",
            "4",
            False,
            {
                "memory": {"value": "40Gi", "requestPolicy": policy("0", "0", "40Gi", "1Mi")},
                "shares": {"value": "4", "requestPolicy": policy("1", "1", "4", "1")},
            },
            id="gpu-4-shares",
        ),
        pytest.param(
            "gpu-0",
            "1",
            False,
            {
                "memory": {"value": "40Gi", "requestPolicy": policy("0", "0", "40Gi", "1Mi")},
                # min + step must not pass the value: one share has no step
                "shares": {"value": "1", "requestPolicy": policy("1", "1", "1")},
            },
            id="gpu-1-share",
        ),
        pytest.param(
            "gpu-0",
            "memory",
            True,
            {
                "memory": {"value": "40Gi", "requestPolicy": policy("40Gi", "1Mi", "40Gi", "1Mi")},
                "compute": {"value": "100", "requestPolicy": policy("0", "0", "100", "1")},
            },
            id="gpu-memory-compute",
        ),
        pytest.param(
            "odd",
            "memory",
            False,
            {"memory": {"value": "40Gi", "requestPolicy": policy("40Gi", "1Mi", "40Gi", "1Mi")}},
            id="memory-rounded-down-to-MiB",
        ),
        pytest.param(
            MIG,
            "unlimited",
            False,
            {
                "multiprocessors": {"value": "14", "requestPolicy": policy("0", "0", "14", "1")},
                "copyEngines": {"value": "1", "requestPolicy": policy("0", "0", "1", "1")},
                "decoders": {"value": "0"},
                "encoders": {"value": "0"},
                "jpegEngines": {"value": "0"},
                "ofaEngines": {"value": "0"},
                "memory": {"value": "4864Mi", "requestPolicy": policy("0", "0", "4864Mi", "1Mi")},
            },
            id="mig-unlimited",
        ),
    ],
)
def test_published_shape(device: str, mode: str, compute: bool, capacity: dict[str, Any]) -> None:
    found = odd_gpu() if device == "odd" else INVENTORY[device]
    out = published_device(found, mode, compute=compute)
    assert out["allowMultipleAllocations"] is True
    assert out["capacity"] == capacity
    assert out["attributes"] == published_device(found, "memory")["attributes"]


def test_shares_off_publish_as_before() -> None:
    (one,) = published.node_slices(
        [INVENTORY["gpu-0"]], driver_name="gpu.nvidia.com", node_name="n", node_uid=None
    )
    (device,) = one["spec"]["devices"]
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "40Gi"}}


def test_128_shared_devices_fit_one_slice() -> None:
    mode = shares.ShareMode("memory")
    devices = shares.shared([INVENTORY["gpu-0"]] * 128, mode)
    parts = slices.build_resource_slices(
        devices=devices, driver_name="d", node_name="n", pool_generation=1, node_owner=None
    )
    assert [len(p["spec"]["devices"]) for p in parts] == [128]


@pytest.mark.parametrize(
    ("flag", "env", "mps", "want"),
    [
        (None, None, None, None),
        ("disabled", None, None, None),
        ("memory", None, None, shares.ShareMode("memory")),
        (None, "unlimited", None, shares.ShareMode("unlimited")),
        ("8", None, "true", shares.ShareMode("shares", shares=8, compute=True)),
        ("memory", None, "true", shares.ShareMode("memory", compute=True)),
    ],
)
def test_mode_from_flag_and_environment(
    flag: str | None, env: str | None, mps: str | None, want: shares.ShareMode | None
) -> None:
    values = {"node_name": "n", "consumable_shares": flag, "mps_support": mps}
    environ = {"CONSUMABLE_SHARES": env} if env else {}
    assert build_settings(values, environ).consumable_shares == want


@pytest.mark.parametrize("bad", ["0", "-2", "half", "1.5"])
def test_bad_mode_is_refused_naming_the_choices(bad: str) -> None:
    with pytest.raises(SettingsError, match="memory, unlimited, a positive integer or disabled"):
        build_settings({"node_name": "n", "consumable_shares": bad}, {})


# --- prepare ----------------------------------------------------------------------------------


def shared_result(
    device: str, share: str, *, request: str = "gpu", **consumed: str
) -> dict[str, Any]:
    return {
        "request": request,
        "driver": "gpu.nvidia.com",
        "pool": "node-a",
        "device": device,
        "shareID": share,
        "consumedCapacity": consumed,
    }


class Node:
    """A simulated node whose sharing commands are recorded in its state directory."""

    def __init__(self, root: Path, fetcher: FakeFetcher | None = None) -> None:
        self.root = root
        self.fetcher = fetcher or FakeFetcher()

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def commands_file(self) -> Path:
        return self.state_dir / "commands.jsonl"

    def state(self, *, mps_on: bool = True, **kwargs: Any) -> DeviceState:
        sharing = Sharing(
            runner=RecordingRunner(self.commands_file),
            state_dir=self.state_dir,
            switches=Switches(mps=mps_on),
        )
        return device_state(
            self.root, devices=INVENTORY, claims=self.fetcher, sharing=sharing, **kwargs
        )

    def records(self) -> dict[str, Any]:
        return dict(CheckpointStore(self.state_dir).load().claims)

    @staticmethod
    def claim_of(pipe: str) -> str:
        """The test claim (UID "a", "b", ...) whose daemon directory holds ``pipe``."""
        key = Path(pipe).parent.name
        return next((u for u in "abcdefgh" if mps.claim_key(u) == key), key)

    def limits(self) -> dict[str, list[str]]:
        """Claim UID -> the limits its daemon was given (in order)."""
        out: dict[str, list[str]] = {}
        for command in recorded(self.commands_file):
            pipe = command.env.get("CUDA_MPS_PIPE_DIRECTORY", "")
            lines = [x for x in command.stdin.splitlines() if x.startswith("set_default")]
            if pipe and lines:
                out.setdefault(self.claim_of(pipe), []).extend(lines)
        return out

    def quits(self) -> list[str]:
        return [
            self.claim_of(c.env["CUDA_MPS_PIPE_DIRECTORY"])
            for c in recorded(self.commands_file)
            if c.stdin.strip() == "quit"
        ]

    def daemons(self) -> set[str]:
        return mps.MpsControl(RecordingRunner(self.commands_file), self.state_dir).claims()


@pytest.fixture
def node(short_tmp: Path) -> Node:
    return Node(short_tmp)


def prepare(state: DeviceState, uid: str) -> str:
    return state.prepare([ref(uid)])[ClaimUID(uid)].error


def test_two_claims_on_one_gpu_are_two_records(node: Node) -> None:
    node.fetcher.add(claim("a", [shared_result("gpu-0", "s-a", memory="16Gi")]))
    node.fetcher.add(claim("b", [shared_result("gpu-0", "s-b", memory="8Gi")]))
    state = node.state(mps_on=False)
    assert prepare(state, "a") == "" and prepare(state, "b") == ""
    held = {
        u: [(d.device, d.share_id, d.consumed) for d in r.devices]
        for u, r in node.records().items()
    }
    assert held == {
        "a": [("gpu-0", "s-a", {"memory": 16 * GI})],
        "b": [("gpu-0", "s-b", {"memory": 8 * GI})],
    }
    answer = state.prepare([ref("b")])[ClaimUID("b")]
    assert [d.share_id for d in answer.devices] == ["s-b"]


def test_a_share_that_does_not_fit_is_refused_naming_the_holders(node: Node) -> None:
    node.fetcher.add(claim("a", [shared_result("gpu-0", "s-a", memory="24Gi")]))
    node.fetcher.add(claim("b", [shared_result("gpu-0", "s-b", memory="16Gi")]))
    node.fetcher.add(claim("c", [shared_result("gpu-0", "s-c", memory="1Gi")]))
    state = node.state(mps_on=False)
    assert prepare(state, "a") == "" and prepare(state, "b") == ""
    error = prepare(state, "c")
    assert error == (
        "claim default/claim-c: device gpu-0 has 40Gi memory: claims default/claim-a (a), "
        "default/claim-b (b) hold 40Gi, this share asks 1Gi"
    )
    assert set(node.records()) == {"a", "b"}
    assert state.unprepare([ref("b")]) == {"b": ""}  # exactly b's share is freed
    assert prepare(state, "c") == ""
    assert set(node.records()) == {"a", "c"}


def test_two_requests_of_one_claim_on_one_device_are_one_share_of_their_sum(node: Node) -> None:
    results = [
        shared_result("gpu-0", "s-1", request="x", memory="4Gi"),
        shared_result("gpu-0", "s-2", request="y", memory="6Gi"),
    ]
    node.fetcher.add(claim("a", results))
    state = node.state()
    assert prepare(state, "a") == ""
    (device,) = node.records()["a"].devices
    assert (device.request_names, device.consumed) == (("x", "y"), {"memory": 10 * GI})
    assert node.limits() == {"a": ["set_default_device_pinned_mem_limit 0 10240M"]}


def test_each_share_gets_a_daemon_with_its_limits(node: Node) -> None:
    node.fetcher.add(claim("a", [shared_result("gpu-0", "s-a", memory="16Gi", compute="30")]))
    node.fetcher.add(claim("b", [shared_result("gpu-0", "s-b", memory="20Gi")]))
    state = node.state()
    assert prepare(state, "a") == "" and prepare(state, "b") == ""
    assert node.limits() == {
        "a": [
            "set_default_active_thread_percentage 30",
            "set_default_device_pinned_mem_limit 0 16384M",
        ],
        "b": ["set_default_device_pinned_mem_limit 0 20480M"],
    }
    assert node.daemons() == {"a", "b"}
    assert state.unprepare([ref("a")]) == {"a": ""}
    assert node.quits() == ["a"] and node.daemons() == {"b"}


def test_a_lower_limit_of_the_claims_own_config_is_kept(node: Node) -> None:
    own = gpu_config(
        sharing={
            "strategy": "MPS",
            "mpsConfig": {
                "defaultPinnedDeviceMemoryLimit": "2Gi",
                "defaultActiveThreadPercentage": 80,
            },
        }
    )
    node.fetcher.add(
        claim(
            "a",
            [shared_result("gpu-0", "s-a", memory="16Gi", compute="20")],
            configs=[config(own)],
        )
    )
    assert prepare(node.state(), "a") == ""
    assert node.limits() == {
        "a": [
            "set_default_active_thread_percentage 20",
            "set_default_device_pinned_mem_limit 0 2048M",
        ]
    }


def test_time_slicing_config_on_a_share_sets_no_interval(node: Node) -> None:
    sliced = gpu_config(
        sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    )
    node.fetcher.add(
        claim("a", [shared_result("gpu-0", "s-a", memory="16Gi")], configs=[config(sliced)])
    )
    sharing = Sharing(
        runner=RecordingRunner(node.commands_file),
        state_dir=node.state_dir,
        switches=Switches(time_slicing=True, mps=True),
    )
    state = device_state(node.root, devices=INVENTORY, claims=node.fetcher, sharing=sharing)
    assert prepare(state, "a") == ""
    assert not [c for c in recorded(node.commands_file) if c.argv[0] == "nvidia-smi"]
    assert node.limits() == {"a": ["set_default_device_pinned_mem_limit 0 16384M"]}


def test_a_share_that_consumed_nothing_runs_no_daemon(node: Node) -> None:
    node.fetcher.add(claim("a", [shared_result("gpu-0", "s-a", memory="0")]))
    assert prepare(node.state(), "a") == ""
    assert node.daemons() == set() and recorded(node.commands_file) == []


class _Crash(BaseException):
    """Stops the transaction like SIGKILL: no except clause of the plugin catches it."""


def _snapshot_at(target: str, src: Path, dst: Path) -> Callable[[str], None]:
    def fault(step: str) -> None:
        if step == target:
            shutil.copytree(src, dst)
            raise _Crash(step)

    return fault


@pytest.mark.parametrize("step", [*SIDE_EFFECT_FAULT_STEPS, *FAULT_STEPS])
def test_crash_at_each_step_of_a_share_then_restart(short_tmp: Path, step: str) -> None:
    fetcher = FakeFetcher(
        claim("a", [shared_result("gpu-0", "s-a", memory="16Gi")]),
        claim("b", [shared_result("gpu-0", "s-b", memory="20Gi")]),
    )
    live, frozen = Node(short_tmp / "live", fetcher), Node(short_tmp / "frozen", fetcher)
    live.root.mkdir()
    assert prepare(live.state(), "a") == ""
    unprepare = step.startswith("unprepare")
    if unprepare:
        assert prepare(live.state(), "b") == ""
    crashing = live.state(fault=_snapshot_at(step, live.root, frozen.root))
    with pytest.raises(_Crash):
        (crashing.unprepare if unprepare else crashing.prepare)([ref("b")])

    restarted = frozen.state()  # the process that comes back sees exactly the frozen disk
    before = len(recorded(frozen.commands_file))
    report = restarted.start()
    assert report.problems == ()
    # The daemons match the records: a's untouched (it answers), b's only if b is completed.
    assert "a" in frozen.daemons()
    assert ("b" in frozen.daemons()) == ("b" in frozen.records())
    assert "a" not in frozen.quits()[before:]
    if unprepare:
        assert restarted.unprepare([ref("b")]) == {"b": ""}
        assert set(frozen.records()) == {"a"} and frozen.daemons() == {"a"}
    else:
        assert prepare(restarted, "b") == ""
        assert set(frozen.records()) == {"a", "b"} and frozen.daemons() == {"a", "b"}
        assert frozen.limits()["b"][-1] == "set_default_device_pinned_mem_limit 0 20480M"
    assert [d.consumed for d in frozen.records()["a"].devices] == [{"memory": 16 * GI}]
