"""The committed plain manifests against the programs they run (no cluster, no helm needed).

``manifests/rendered/*.yaml`` are the chart rendered (a cluster-tier test proves they are current).
Here they are checked against the code they start:

Cases:
- every subcommand and flag the Deployment/DaemonSet pass exists in ``dra_gpu.cli``;
- every environment variable the plugin container gets is one the plugin reads (the driver root
  mounted at ``/driver-root`` read there, the host's ``/`` named in CDI specs), node name and pod
  UID come from the downward API, and the sockets' host paths are mounted at the same path;
- the plugin rolls out with surge (a new pod before the old one goes) and tolerates GPU nodes;
- the controller runs as the image's non-root user, without privileges;
- the simulated variant runs the plugin without privileges or capabilities.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu import cli
from dra_gpu.plugin import settings as plugin_settings

ROOT = Path(__file__).resolve().parents[2]
RENDERED = ROOT / "manifests" / "rendered"


def objects(name: str) -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((RENDERED / name).read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def subparser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    result: argparse.ArgumentParser = sub.choices[name]
    return result


@pytest.fixture(params=["dra-gpu.yaml", "dra-gpu-simulated.yaml"])
def rendered(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    return objects(request.param)


def test_controller_arguments_are_real_flags(rendered: dict[str, dict[str, Any]]) -> None:
    args = container(rendered["Deployment/dra-gpu-controller"])["args"]
    assert args[0] == "controller"
    parsed = subparser("controller").parse_args(args[1:])
    assert parsed.lease_name == "dra-gpu-controller"


def test_plugin_environment_is_read_by_the_plugin(rendered: dict[str, dict[str, Any]]) -> None:
    plugin = container(rendered["DaemonSet/dra-gpu-kubelet-plugin"])
    assert plugin["args"] == ["kubelet-plugin"]
    subparser("kubelet-plugin")  # the subcommand exists
    env = {e["name"]: e for e in plugin["env"]}
    assert set(env) <= set(plugin_settings.ENV_VARS.values())
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    values = {k: v["value"] for k, v in env.items() if "value" in v}
    settings = plugin_settings.build_settings({}, {**values, "NODE_NAME": "n", "POD_UID": "u1"})
    assert settings.rolling_update
    assert settings.healthz_address == "0.0.0.0"
    if "DRIVER_ROOT" in env:
        # the host's / is mounted at /driver-root; CDI specs must name host paths
        assert settings.driver_root == Path("/driver-root")
        assert settings.host_driver_root == Path("/")
        mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
        assert mounts["driver-root"] == "/driver-root"


def test_plugin_sockets_and_specs_are_on_host_paths_at_the_same_path(
    rendered: dict[str, dict[str, Any]],
) -> None:
    ds = rendered["DaemonSet/dra-gpu-kubelet-plugin"]
    plugin = container(ds)
    host = {
        v["name"]: v["hostPath"]["path"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    for variable in ("PLUGIN_REGISTRY_DIR", "PLUGIN_DATA_DIR", "CDI_ROOT", "STATE_DIR"):
        volume = next(name for name, path in mounts.items() if path == env[variable])
        assert host[volume] == env[variable], f"{variable} is not at its host path"


def test_plugin_rolls_out_with_surge_onto_gpu_nodes(rendered: dict[str, dict[str, Any]]) -> None:
    spec = rendered["DaemonSet/dra-gpu-kubelet-plugin"]["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    tolerations = spec["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    probes = container(rendered["DaemonSet/dra-gpu-kubelet-plugin"])
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_controller_runs_as_the_images_unprivileged_user(
    rendered: dict[str, dict[str, Any]],
) -> None:
    pod = rendered["Deployment/dra-gpu-controller"]["spec"]["template"]["spec"]
    user = re.search(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert user is not None
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(user.group(1))
    ctx = container(rendered["Deployment/dra-gpu-controller"])["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["readOnlyRootFilesystem"] is True


def test_real_gpus_need_a_privileged_plugin_simulated_ones_do_not() -> None:
    real = container(objects("dra-gpu.yaml")["DaemonSet/dra-gpu-kubelet-plugin"])
    simulated = container(objects("dra-gpu-simulated.yaml")["DaemonSet/dra-gpu-kubelet-plugin"])
    assert real["securityContext"]["privileged"] is True
    assert "privileged" not in simulated["securityContext"]
    assert simulated["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert simulated["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e.get("value") for e in simulated["env"]}
    assert env["DRA_GPU_SIMULATE"] == "h200x8"
    assert "DRIVER_ROOT" not in env
