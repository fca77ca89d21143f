"""Kubelet plugin settings: flags, environment variables, defaults, validation, socket names.

Cases: defaults; env fills in a missing flag; a flag wins over env; errors name what is wrong;
default vs rolling-update socket names; the CLI exits 2 on an unusable setting.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dra_gpu import cli
from dra_gpu.plugin import settings as plugin_settings


def parse(argv: list[str], env: dict[str, str] | None = None) -> plugin_settings.Settings:
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    return plugin_settings.build_settings(vars(parser.parse_args(argv)), env or {})


def test_defaults() -> None:
    s = parse(["--node-name", "n1"])
    assert s.driver_name == "gpu.nvidia.com"
    assert s.plugin_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert s.plugin_data_dir == Path("/var/lib/kubelet/plugins/gpu.nvidia.com")
    assert s.state_dir == s.plugin_data_dir
    assert s.cdi_root == Path("/var/run/cdi")
    assert s.kubeconfig is None and s.pod_uid is None and s.healthz_port is None
    assert s.healthz_address == "127.0.0.1"
    assert not s.rolling_update


def test_environment_fills_in_missing_flags() -> None:
    env = {
        "NODE_NAME": "n2",
        "POD_UID": "0f3a-11",
        "KUBECONFIG": "/k/config",
        "HEALTHZ_PORT": "8081",
        "DRA_GPU_SIMULATE": "h200x8",
        "PLUGIN_DATA_DIR": "/data",
    }
    s = parse([], env)
    assert (s.node_name, s.pod_uid, s.healthz_port, s.simulate) == ("n2", "0f3a-11", 8081, "h200x8")
    assert s.kubeconfig == Path("/k/config")
    assert s.plugin_data_dir == Path("/data") and s.state_dir == Path("/data")
    assert s.rolling_update


def test_healthz_port_zero_is_off() -> None:
    assert parse(["--node-name", "n", "--healthz-port", "0"]).healthz_port is None


def test_rediscovery_every_minute_unless_turned_off() -> None:
    assert parse(["--node-name", "n"]).rediscover_interval_s == 60.0
    assert parse(["--node-name", "n"], {"REDISCOVER_INTERVAL": "2.5"}).rediscover_interval_s == 2.5
    assert parse(["--node-name", "n", "--rediscover-interval", "0"]).rediscover_interval_s is None


def test_flag_wins_over_environment() -> None:
    s = parse(["--node-name", "flag", "--driver-name", "x.example.com"], {"NODE_NAME": "env"})
    assert s.node_name == "flag"
    assert s.plugin_data_dir == Path("/var/lib/kubelet/plugins/x.example.com")


N = {"NODE_NAME": "n"}


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param([], {}, "node name is required", id="no-node"),
        pytest.param(["--driver-name", "Bad_Name"], N, "DNS subdomain", id="driver"),
        pytest.param(["--pod-uid", "a/b"], N, "pod UID", id="pod-uid"),
        pytest.param(["--healthz-port", "http"], N, "must be a number", id="port-nan"),
        pytest.param([], {**N, "HEALTHZ_PORT": "70000"}, "0..65535", id="port-range"),
        pytest.param(["--cdi-root", "rel/dir"], N, "absolute path", id="relative"),
        pytest.param(["--log-level", "loud"], N, "log level", id="log-level"),
        pytest.param(["--plugin-data-dir", "/" + "d" * 110], N, "socket path", id="long-path"),
        pytest.param(["--rediscover-interval", "1m"], N, "number of seconds", id="interval-nan"),
        pytest.param([], {**N, "REDISCOVER_INTERVAL": "-5"}, ">= 0 seconds", id="interval-neg"),
        pytest.param(["--rediscover-interval", "inf"], N, ">= 0 seconds", id="interval-inf"),
    ],
)
def test_invalid_settings_are_refused_with_a_clear_message(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(plugin_settings.SettingsError, match=message):
        parse(argv, env)


@pytest.mark.parametrize(
    ("pod_uid", "reg", "dra"),
    [
        pytest.param(None, "gpu.nvidia.com-reg.sock", "dra.sock", id="default"),
        pytest.param(
            "abc-123", "gpu.nvidia.com-abc-123-reg.sock", "dra-abc-123.sock", id="rolling"
        ),
    ],
)
def test_socket_names(pod_uid: str | None, reg: str, dra: str) -> None:
    argv = ["--node-name", "n", "--plugin-registry-dir", "/reg", "--plugin-data-dir", "/data"]
    if pod_uid:
        argv += ["--pod-uid", pod_uid]
    paths = plugin_settings.socket_paths(parse(argv))
    assert paths.registration == Path("/reg") / reg
    assert paths.dra == Path("/data") / dra
    assert paths.lock.parent == Path("/data")


def test_a_plugin_started_with_an_unusable_setting_exits_2_saying_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["kubelet-plugin", "--node-name", "n", "--log-level", "loud"]) == 2
    assert "log level must be DEBUG, INFO, WARNING or ERROR, got 'LOUD'" in capsys.readouterr().err
