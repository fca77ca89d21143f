"""The sharing strategy table (dra_gpu.config.strategies) and that its callers ask it.

The table is the one place a strategy's answers live: telemetry, consumable shares and the
plugin's switches ask the row, so a strategy added as a row (with its config and its node-side
module, docs/development/where-to-change-what.md) is treated right by them without their code
naming it. The "callers ask" tests below change the table and watch the callers follow.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from fake_claims import FakeFetcher, claim, device_state, inventory, ref

from dra_gpu.config import DeviceConfig, GpuSharing, MigDeviceSharing, strategies, v1beta1
from dra_gpu.config.v1beta1 import Strategy
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.plugin import settings as plugin_settings
from dra_gpu.plugin import usage_series
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, CheckpointStore, ClaimRecord, DeviceRecord
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.sharing.runner import RecordingRunner

MPS = strategies.STRATEGIES["MPS"]
TIME_SLICING = strategies.STRATEGIES["TimeSlicing"]


# --- the table ---------------------------------------------------------------------------------


def test_one_row_per_strategy_a_config_may_name() -> None:
    assert set(strategies.STRATEGIES) == set(get_args(Strategy))
    assert (strategies.MPS, strategies.TIME_SLICING) == (v1beta1.MPS, v1beta1.TIME_SLICING)
    assert all(name == row.name for name, row in strategies.STRATEGIES.items())


def test_each_row_names_its_sub_config_and_mig_devices_have_it_unless_gpu_wide() -> None:
    for row in strategies.STRATEGIES.values():
        assert row.sub_config in GpuSharing.model_fields
        # A setting of the whole GPU (the time-slice interval) cannot be asked of a MIG device.
        assert (row.sub_config in MigDeviceSharing.model_fields) is not row.per_gpu


def test_each_row_is_switched_by_a_plugin_flag_and_variable() -> None:
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    flags = {o for a in parser._actions for o in a.option_strings}
    fields = {f.name for f in dataclasses.fields(plugin_settings.Settings)}
    for row in strategies.STRATEGIES.values():
        assert row.flag in flags and row.setting in fields
        assert plugin_settings.ENV_VARS[row.setting] == row.env


def test_what_each_strategy_answers() -> None:
    assert (MPS.through_daemon, MPS.limits_shares, MPS.per_gpu) == (True, True, False)
    assert (TIME_SLICING.through_daemon, TIME_SLICING.limits_shares, TIME_SLICING.per_gpu) == (
        False,
        False,
        True,
    )
    assert strategies.share_limiter() is MPS
    assert MPS.compute_share({"mpsConfig": {"defaultActiveThreadPercentage": 25}}) == 0.25
    assert MPS.compute_share({"mpsConfig": {}}) is None  # no cap asked
    assert TIME_SLICING.compute_share({"timeSlicingConfig": {"interval": "Long"}}) is None
    assert strategies.recorded({"strategy": "MPS"}) is MPS
    assert strategies.recorded({"strategy": "Exclusive"}) is None  # another release's record
    assert strategies.recorded(None) is None


def test_a_strategy_that_cannot_cap_a_share_says_so() -> None:
    from dra_gpu.config import default_gpu_config

    with pytest.raises(ValueError, match="TimeSlicing cannot cap a consumable share"):
        TIME_SLICING.limited(default_gpu_config(), 1 << 30, 0)


def test_share_caps_come_from_the_limiting_strategy() -> None:
    from dra_gpu.config import default_gpu_config

    capped = MPS.limited(default_gpu_config(), 3 << 30, 40)
    assert capped.sharing is not None and capped.sharing.strategy == "MPS"
    mps = capped.sharing.mpsConfig
    assert mps is not None
    assert (mps.defaultPinnedDeviceMemoryLimit, mps.defaultActiveThreadPercentage) == ("3072Mi", 40)


def test_the_table_loads_no_pydantic() -> None:
    # The plugin's flag parser and `dra-gpu discover` read the table; neither may pay for it.
    import subprocess

    code = (
        "import sys, dra_gpu.config.strategies as s; s.share_limiter(); "
        "print('pydantic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- callers ask the table ---------------------------------------------------------------------


def _capping(config: DeviceConfig, memory: int, compute: int) -> DeviceConfig:
    return config  # a stand-in strategy's caps: leaves the config as it is


@pytest.fixture
def time_slicing_caps_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table changed: time-slicing caps shares and goes through a daemon; MPS does neither."""
    table = {
        "TimeSlicing": dataclasses.replace(
            TIME_SLICING, limiter=_capping, through_daemon=True, compute_share_field="interval"
        ),
        "MPS": dataclasses.replace(
            MPS, limiter=None, through_daemon=False, compute_share_field=None
        ),
    }
    monkeypatch.setattr(strategies, "STRATEGIES", table)


def _holder(sharing: dict[str, Any]) -> usage_series.Holder:
    record = ClaimRecord(
        state=PREPARE_COMPLETED,
        namespace="team",
        name="c",
        devices=(DeviceRecord(pool="n", device="gpu-0", config={"sharing": sharing}),),
    )
    (holder,) = usage_series.holders({"u": record}, pool="n")["gpu-0"]
    return holder


def test_telemetry_asks_the_table(time_slicing_caps_shares: None) -> None:
    mps = _holder({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})
    assert (mps.through_daemon, mps.compute_share) == (False, None)
    sliced = _holder({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 30}})
    assert (sliced.through_daemon, sliced.compute_share) == (True, 0.3)


def test_telemetry_as_the_table_stands() -> None:
    mps = _holder({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})
    assert (mps.through_daemon, mps.compute_share) == (True, 0.5)
    sliced = _holder({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    assert (sliced.through_daemon, sliced.compute_share) == (False, None)


def _compute_published(values: dict[str, object], env: dict[str, str]) -> bool:
    base: dict[str, object] = {"node_name": "n", "consumable_shares": "memory"}
    mode = plugin_settings.build_settings({**base, **values}, env).consumable_shares
    assert mode is not None
    return mode.compute


def test_the_plugin_switches_the_strategies_its_settings_name() -> None:
    base: dict[str, object] = {"node_name": "n"}
    for values, names in [
        ({}, set()),
        ({"mps_support": "true"}, {"MPS"}),
        ({"mps_support": "true", "time_slicing_settings": "true"}, {"MPS", "TimeSlicing"}),
    ]:
        settings = plugin_settings.build_settings({**base, **values}, {})
        assert settings.sharing_strategies == names
        assert Switches.of(settings.sharing_strategies).enabled == names


def test_shares_publish_compute_where_the_table_says() -> None:
    assert _compute_published({"mps_support": "true"}, {}) is True
    assert _compute_published({}, {"MPS_SUPPORT": "true"}) is True
    assert _compute_published({"time_slicing_settings": "true"}, {}) is False


def test_shares_ask_the_table_which_switch_caps_them(time_slicing_caps_shares: None) -> None:
    assert _compute_published({"mps_support": "true"}, {}) is False
    assert _compute_published({"time_slicing_settings": "true"}, {}) is True
    assert Switches(time_slicing=True).enabled == {"TimeSlicing"}
    assert Sharing.off(Path("/unused")).limits_shares is False
    on = Sharing(runner=RecordingRunner(Path("/unused")), state_dir=Path("/unused"))
    assert dataclasses.replace(on, switches=Switches(time_slicing=True)).limits_shares is True
    assert dataclasses.replace(on, switches=Switches(mps=True)).limits_shares is False


def test_prepare_caps_a_share_through_the_limiting_strategy(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[int, int]] = []

    def capping(config: DeviceConfig, memory: int, compute: int) -> DeviceConfig:
        asked.append((memory, compute))
        return config

    table = {
        "TimeSlicing": dataclasses.replace(TIME_SLICING, limiter=capping),
        "MPS": dataclasses.replace(MPS, limiter=None),
    }
    monkeypatch.setattr(strategies, "STRATEGIES", table)
    fetcher = FakeFetcher()
    result = {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": "node-a",
        "device": "gpu-0",
        "shareID": "s-a",
        "consumedCapacity": {"memory": "2Gi", "compute": "30"},
    }
    fetcher.add(claim("a", [result]))
    state_dir = short_tmp / "state"
    sharing = Sharing(
        runner=RecordingRunner(state_dir / "commands.jsonl"),
        state_dir=state_dir,
        switches=Switches(time_slicing=True),
    )
    state = device_state(short_tmp, devices=inventory(), claims=fetcher, sharing=sharing)
    assert state.prepare([ref("a")])[ClaimUID("a")].error == ""
    assert asked == [(2 << 30, 30)]
    assert set(CheckpointStore(state_dir).load().claims) == {"a"}
