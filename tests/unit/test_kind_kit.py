"""The kind kit (e2e/kind/), checked without Docker; `make kind-e2e` runs it (outside `make test`).

The cluster config must be a valid kind config giving the suite what it needs, the script must
pass shellcheck, and every chart value the script sets must exist in the chart's values.yaml.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from e2e.node.binaries import ensure_debian_packages

ROOT = Path(__file__).resolve().parent.parent.parent
KIND = ROOT / "e2e" / "kind"
VALUES = ROOT / "manifests" / "helm" / "dra-gpu" / "values.yaml"


def _config() -> dict[str, Any]:
    data = yaml.safe_load((KIND / "cluster.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_cluster_config_is_a_kind_cluster_with_cdi_on() -> None:
    config = _config()
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    patches = [tomllib.loads(p) for p in config["containerdConfigPatches"]]
    assert any(p["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True for p in patches)


def test_each_simulated_profile_the_script_installs_has_a_labelled_worker() -> None:
    workers = [n for n in _config()["nodes"] if n["role"] == "worker"]
    labelled = {n["labels"]["dra-gpu.test/profile"] for n in workers}
    script = (KIND / "run.sh").read_text()
    installed = set(re.findall(r"^install_driver \S+ (\S+)$", script, re.MULTILINE))
    assert installed == labelled == {"h200x8", "a100x4-mig"}
    # The suite keeps pods on nodes with this label (it passes it as --node-selector).
    assert all(n["labels"]["dra-gpu.test/real-node"] == "true" for n in workers)
    assert "--node-selector dra-gpu.test/real-node=true" in script


def test_every_chart_value_the_script_sets_exists() -> None:
    values = yaml.safe_load(VALUES.read_text())
    script = (KIND / "run.sh").read_text()
    keys = re.findall(r"--set(?:-string)? \"?([A-Za-z.]+?)(?:\.dra-gpu\\\\\.test/\S+)?=", script)
    assert keys, "no --set found"
    for key in keys:
        node: Any = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{key} is not a chart value"
            node = node[part]


def test_script_passes_shellcheck() -> None:
    ensure_debian_packages(("shellcheck",))
    result = subprocess.run(
        ["shellcheck", "--severity=style", str(KIND / "run.sh")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_cluster_is_deleted_even_when_its_creation_fails() -> None:
    # kind leaves a half-made cluster's containers behind when `create` fails midway.
    script = (KIND / "run.sh").read_text()
    assert script.index("trap cleanup EXIT") < script.index("kind create cluster")
