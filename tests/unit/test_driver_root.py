"""The driver root as the plugin sees it vs as the container runtime sees it, flag to CDI spec.

The chart mounts the host's driver root into the plugin's container: the host's ``/`` at
``/driver-root`` (``DRIVER_ROOT=/driver-root``, ``HOST_DRIVER_ROOT=/``), or the GPU Operator's
``/run/nvidia/driver`` at its own path. The plugin must read files through the first and write
the second into CDI specs, which the runtime resolves on the host.

Cases: ``dra-gpu discover --driver-root`` (default ``$DRIVER_ROOT``, as in the plugin's pod)
reaches the NVML backend; ``--host-driver-root``/``HOST_DRIVER_ROOT`` parsing (defaults to the
driver root, a flag wins over the environment, a relative path is refused); the kubelet plugin's
wiring, from settings to the spec file a prepared claim gets: mounts and device nodes name host
paths, found through the container's view, for a host install and for a driver container.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_claims import FakeFetcher, claim, inventory, result

from dra_gpu import discover_cmd
from dra_gpu.devices import nvml
from dra_gpu.devices.model import Discovery
from dra_gpu.kubeletplugin import events
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.plugin import lifecycle
from dra_gpu.plugin import settings as plugin_settings
from dra_gpu.prepare import cdi, claims
from dra_gpu.prepare.plan import ClaimRef
from dra_gpu.prepare.state import DeviceState

LIBDIR = "usr/lib/x86_64-linux-gnu"
NO_API: Any = None  # claims come from a FakeFetcher; nothing reaches an API server


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, "/"),
        ([], {"DRIVER_ROOT": "/driver-root"}, "/driver-root"),
        (["--driver-root", "/run/nvidia/driver"], {"DRIVER_ROOT": "/x"}, "/run/nvidia/driver"),
    ],
    ids=["default", "plugin-pod-env", "flag-wins"],
)
def test_discover_loads_nvml_under_the_driver_root(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], expected: str
) -> None:
    monkeypatch.delenv("DRIVER_ROOT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    made: list[dict[str, Any]] = []

    def backend(**kwargs: Any) -> SimpleNamespace:
        made.append(kwargs)
        return SimpleNamespace(discover=lambda: Discovery(gpus=(), errors=()))

    monkeypatch.setattr(nvml, "NvmlBackend", backend)
    assert discover_cmd.main(["--node-name", "n", *argv]) == 0
    assert [kw["driver_root"] for kw in made] == [Path(expected)]


def parse(argv: list[str], env: dict[str, str]) -> plugin_settings.Settings:
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    values = vars(parser.parse_args(["--node-name", "node-a", *argv]))
    return plugin_settings.build_settings(values, env)


@pytest.mark.parametrize(
    ("argv", "env", "driver_root", "host_driver_root"),
    [
        ([], {}, "/", "/"),
        (["--driver-root", "/run/nvidia/driver"], {}, "/run/nvidia/driver", "/run/nvidia/driver"),
        ([], {"DRIVER_ROOT": "/driver-root", "HOST_DRIVER_ROOT": "/"}, "/driver-root", "/"),
        (["--host-driver-root", "/h"], {"HOST_DRIVER_ROOT": "/env"}, "/", "/h"),
    ],
    ids=["defaults", "follows-driver-root", "chart-host-install", "flag-wins"],
)
def test_host_driver_root_settings(
    argv: list[str], env: dict[str, str], driver_root: str, host_driver_root: str
) -> None:
    s = parse(argv, env)
    assert (s.driver_root, s.host_driver_root) == (Path(driver_root), Path(host_driver_root))


def test_relative_host_driver_root_is_refused() -> None:
    with pytest.raises(
        plugin_settings.SettingsError, match="host driver root must be an absolute path"
    ):
        parse([], {"HOST_DRIVER_ROOT": "run/nvidia/driver"})


def fake_driver(root: Path, *, dev_nodes: bool) -> None:
    """What the plugin sees under its driver root: libraries, a tool, maybe the device nodes."""
    libdir = root / LIBDIR
    libdir.mkdir(parents=True)
    (libdir / "libcuda.so.580.159.03").write_text("elf")
    (libdir / "libcuda.so.1").symlink_to("libcuda.so.580.159.03")
    (libdir / "libnvidia-ml.so.580.159.03").write_text("elf")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!")
    if dev_nodes:
        (root / "dev").mkdir()
        (root / "dev/nvidiactl").write_text("")


@pytest.fixture
def prepared_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:  # a function (env) -> the spec of a claim prepared with those settings
    fetcher = FakeFetcher(claim("u1", [result("gpu-0")]))
    monkeypatch.setattr(claims, "KubeClaimFetcher", lambda client: fetcher)
    monkeypatch.setattr(claims, "NodeEventReporter", lambda client, **_: print)
    states: list[DeviceState] = []
    devices = inventory()

    def prepare(env: dict[str, str]) -> dict[str, Any]:
        dirs = {"CDI_ROOT": str(tmp_path / "cdi"), "STATE_DIR": str(tmp_path / "state")}
        settings = parse([], {**env, **dirs})
        state = lifecycle.device_state(
            settings,
            platform=lifecycle.platform_of(settings),
            client=NO_API,
            inventory=lambda: devices,
            poster=events.EventPoster(NO_API),
        )
        states.append(state)
        out = state.prepare([ClaimRef(uid=ClaimUID("u1"), namespace="default", name="claim-u1")])
        assert out[ClaimUID("u1")].error == ""
        spec: dict[str, Any] = json.loads(
            cdi.spec_path(settings.cdi_root, ClaimUID("u1")).read_text()
        )
        return spec

    yield prepare
    for state in states:
        state.close()


def host_paths(spec: dict[str, Any]) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}


def device_nodes(spec: dict[str, Any]) -> list[dict[str, str]]:
    return [*spec["devices"][0]["containerEdits"]["deviceNodes"]]


def test_chart_host_install_mounts_host_paths(tmp_path: Path, prepared_spec: Any) -> None:
    container_root = tmp_path / "driver-root"  # the host's / as the plugin's container sees it
    fake_driver(container_root, dev_nodes=True)  # the host's /dev is under it too
    spec = prepared_spec({"DRIVER_ROOT": str(container_root), "HOST_DRIVER_ROOT": "/"})
    libcuda = f"/{LIBDIR}/libcuda.so.1"
    assert host_paths(spec)[libcuda] == libcuda
    assert host_paths(spec)["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
    assert not any(str(tmp_path) in p for p in host_paths(spec).values())
    assert device_nodes(spec) == [{"path": "/dev/nvidia0"}], "the host's own /dev/nvidia0"


def test_driver_container_root_at_its_host_path(tmp_path: Path, prepared_spec: Any) -> None:
    root = tmp_path / "run/nvidia/driver"  # mounted at the same path: no HOST_DRIVER_ROOT
    fake_driver(root, dev_nodes=True)
    spec = prepared_spec({"DRIVER_ROOT": str(root)})
    assert host_paths(spec)[f"/{LIBDIR}/libcuda.so.1"] == f"{root}/{LIBDIR}/libcuda.so.1"
    assert device_nodes(spec) == [{"path": "/dev/nvidia0", "hostPath": f"{root}/dev/nvidia0"}]


def test_driver_container_seen_elsewhere_names_its_host_path(
    tmp_path: Path, prepared_spec: Any
) -> None:
    seen = tmp_path / "driver-root"
    fake_driver(seen, dev_nodes=True)
    spec = prepared_spec({"DRIVER_ROOT": str(seen), "HOST_DRIVER_ROOT": "/run/nvidia/driver"})
    assert (
        host_paths(spec)[f"/{LIBDIR}/libcuda.so.1"] == f"/run/nvidia/driver/{LIBDIR}/libcuda.so.1"
    )
    assert device_nodes(spec) == [
        {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}
    ]
