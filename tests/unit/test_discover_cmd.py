"""``dra-gpu discover``: what people and kubectl see.

Cases: the table has one row a device with the columns people need; json is a v1 List of the
exact ResourceSlices; yaml is a multi-document stream of the same objects; an unknown profile is
a usage error naming the built-ins; the NVML path prints the devices it could read and exits 1
when a GPU was skipped; the discover path without --simulate imports neither pydantic nor yaml.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from fake_slice_store import FakeSliceStore
from nvml_fakes import FakeGpu, FakeNvml

from dra_gpu import cli, discover_cmd
from dra_gpu.devices import nvml, profiles, simulated
from dra_gpu.kubeletplugin import publisher, slices
from dra_gpu.plugin import inventory, node_plugin, platforms
from dra_gpu.plugin import settings as plugin_settings


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["discover", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--simulate", "a100x4-mig", "--node-name", "n1")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "PRODUCT", "MEMORY", "MIG", "PROFILE", "UUID"]
    assert len(lines) == 1 + 10
    assert lines[1].split()[:5] == ["gpu-0", "gpu", "NVIDIA", "A100-SXM4-40GB", "40.0"]
    me = next(line for line in lines if line.startswith("gpu-2-mig-1g5gbme-20-6"))
    assert "1g.5gb+me" in me and "MIG-" in me


def test_json_is_the_published_slices(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--simulate", "h200x8", "--node-name", "n1", "-o", "json")
    assert rc == 0
    doc = json.loads(out)
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "List")
    (obj,) = doc["items"]
    assert obj["metadata"]["name"] == "n1-gpu.nvidia.com-0"
    assert obj["spec"]["driver"] == "gpu.nvidia.com"
    assert [d["name"] for d in obj["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert obj["spec"]["devices"][0]["attributes"]["productName"] == {"string": "NVIDIA H200"}


@pytest.mark.parametrize(
    ("profile", "shares"),
    [("h200x8", None), ("a100x4-mig", None), ("h200x8", "memory"), ("a100x4-mig", "4")],
)
def test_json_is_exactly_what_the_plugin_publishes(
    capsys: pytest.CaptureFixture[str], profile: str, shares: str | None
) -> None:
    # The plugin's first publish on node n1, into an in-memory API server.
    settings = plugin_settings.build_settings(
        {"node_name": "n1", "simulate": profile, "consumable_shares": shares}, {}
    )
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=profile, node_name="n1"))
    )
    store = FakeSliceStore()
    publisher.Publisher(
        store=store,
        node="n1",
        driver=settings.driver_name,
        render=node_plugin.renderer(settings, devices),
        alive=lambda other: False,
    ).reconcile_once()

    share_flag = ("--consumable-shares", shares) if shares else ()
    rc, out, _ = run(capsys, "--simulate", profile, "--node-name", "n1", "-o", "json", *share_flag)
    assert rc == 0
    # Only the publisher's bookkeeping differs: its annotations, the Node as owner, and what
    # the API server adds (uid, resourceVersion).
    for obj in store.slices.values():
        for key in ("annotations", "ownerReferences", "uid", "resourceVersion"):
            obj["metadata"].pop(key, None)
    assert json.loads(out)["items"] == sorted(
        store.slices.values(), key=lambda s: str(s["metadata"]["name"])
    )


def test_yaml_matches_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, out_json, _ = run(capsys, "--simulate", "a100x4-mig", "--node-name", "n1", "-o", "json")
    rc, out_yaml, _ = run(capsys, "--simulate", "a100x4-mig", "--node-name", "n1", "-o", "yaml")
    assert rc == 0
    assert list(yaml.safe_load_all(out_yaml)) == json.loads(out_json)["items"]


def test_unknown_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--simulate", "nope")
    assert rc == 2 and out == ""
    assert "no built-in profile or file named 'nope'" in err and "h200x8" in err


def test_nvml_path_prints_readable_gpus_and_fails_on_skipped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml([FakeGpu(index=0, minor=0), FakeGpu(index=1, minor=1, uuid="GPU-1")])
    fake.fail[("nvmlDeviceGetMemoryInfo", 1)] = 15  # NVML_ERROR_GPU_IS_LOST
    monkeypatch.setattr(
        discover_cmd,
        "make_backend",
        lambda **_: nvml.NvmlBackend(nvml=fake),
    )
    rc, out, err = run(capsys, "--node-name", "n1")
    assert rc == 1
    assert "gpu-0" in out and "gpu-1" not in out
    assert "GPU index 1: skipped: nvmlDeviceGetMemoryInfo" in err


def test_resolve_profile_builtin_is_pure_data() -> None:
    assert profiles.resolve_profile("h200x8") is simulated.BUILTIN_PROFILES["h200x8"]
    assert slices.MAX_DEVICES_PER_SLICE == 128


def test_nvml_discover_path_imports_only_what_it_needs() -> None:
    code = (
        "import sys, dra_gpu.discover_cmd as d; "
        "d.make_backend(simulate=None, node_name='n', nvml_timeout_s=1); "
        "d.make_backend(simulate='h200x8', node_name='n', nvml_timeout_s=1); "
        "print(sorted(m for m in ('pydantic', 'yaml', 'kubernetes', 'grpc') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
