"""``dra-gpu discover``: what people and kubectl see.

Cases: the table has one row a device with the columns people need; json is a v1 List of the
exact ResourceSlices; yaml is a multi-document stream of the same objects; an unknown profile is
a usage error naming the built-ins; the NVML path prints the devices it could read and exits 1
when a GPU was skipped; the discover path without --simulate imports neither pydantic nor yaml.
"""

from __future__ import annotations

import argparse
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
from dra_gpu.plugin import inventory, node_plugin, platforms, published
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
    ("profile", "flags"),
    [
        ("h200x8", {}),
        ("a100x4-mig", {}),
        ("h200x8", {"consumable_shares": "memory"}),
        ("a100x4-mig", {"consumable_shares": "4"}),
        ("h200x8", {"consumable_shares": "memory", "mps_support": "true"}),
        ("h100x8-mig", {"mig_mode": "dynamic"}),
        ("h100x8-mig", {"mig_mode": "dynamic", "consumable_shares": "memory"}),
        ("h100x8-mig", {"mig_mode": "dynamic", "binding_conditions": "false"}),
        ("h100x8", {"driver_name": "gpu.example.com"}),
    ],
)
def test_json_is_exactly_what_the_plugin_publishes(
    capsys: pytest.CaptureFixture[str], profile: str, flags: dict[str, str]
) -> None:
    # The plugin's first publish on node n1, into an in-memory API server; a dynamic-MIG plugin
    # adds binding conditions where the server serves them (discover's default: it does).
    plugin_flags = {k: v for k, v in flags.items() if k != "binding_conditions"}
    settings = plugin_settings.build_settings(
        {"node_name": "n1", "simulate": profile, **plugin_flags}, {}
    )
    served = flags.get("binding_conditions", "true") == "true"
    binding = (
        published.mig_binding_conditions(settings.driver_name)
        if settings.mig_mode == "dynamic" and served
        else None
    )
    devices = inventory.discover(
        inventory.backend_for(
            platforms.for_node(simulate=profile, node_name="n1"),
            mig_dynamic=settings.mig_mode == "dynamic",
        )
    )
    store = FakeSliceStore()
    publisher.Publisher(
        store=store,
        node="n1",
        driver=settings.driver_name,
        render=node_plugin.renderer(settings, devices, binding=binding),
        alive=lambda other: False,
    ).reconcile_once()

    argv = [a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", v)]
    rc, out, _ = run(capsys, "--simulate", profile, "--node", "n1", "-o", "json", *argv)
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


def test_resourceslices_is_the_yaml_stream(capsys: pytest.CaptureFixture[str]) -> None:
    _, out_yaml, _ = run(capsys, "--simulate", "h200x8", "--node", "demo-h200", "-o", "yaml")
    rc, out, _ = run(capsys, "--simulate", "h200x8", "--node", "demo-h200", "-o", "resourceslices")
    assert rc == 0 and out == out_yaml
    (obj,) = yaml.safe_load_all(out)
    assert obj["spec"]["nodeName"] == "demo-h200" and obj["spec"]["pool"]["name"] == "demo-h200"


def test_slice_settings_come_from_the_plugins_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In the plugin's pod `dra-gpu discover` prints that pod's slices: same variables.
    monkeypatch.setenv("MIG_MODE", "dynamic")
    monkeypatch.setenv("CONSUMABLE_SHARES", "memory")
    monkeypatch.setenv("MPS_SUPPORT", "true")
    _, env_out, _ = run(capsys, "--simulate", "h100x8-mig", "--node", "n1", "-o", "json")
    for name in ("MIG_MODE", "CONSUMABLE_SHARES", "MPS_SUPPORT"):
        monkeypatch.delenv(name)
    flags = ("--mig-mode", "dynamic", "--consumable-shares", "memory", "--mps-support", "true")
    _, flag_out, _ = run(capsys, "--simulate", "h100x8-mig", "--node", "n1", "-o", "json", *flags)
    _, plain, _ = run(capsys, "--simulate", "h100x8-mig", "--node", "n1", "-o", "json")
    assert env_out == flag_out != plain
    device = json.loads(flag_out)["items"][-1]["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True and "consumesCounters" in device


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--mig-mode", "Dynamic", "MIG mode must be static or dynamic, got 'Dynamic'"),
        ("--mps-support", "yes", "--mps-support must be true or false, got 'yes'"),
        ("--consumable-shares", "half", "half"),
        ("--driver-name", "GPU", "driver name must be a DNS subdomain"),
    ],
)
def test_a_bad_slice_setting_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    rc, out, err = run(capsys, "--simulate", "h200x8", "--node", "n1", flag, value)
    assert rc == 2 and out == ""
    assert message in err


# The plugin's settings that do not change its slices; every other one is a flag of discover.
NOT_IN_SLICES = {
    "node_name",  # discover's --node
    "simulate",  # discover's --simulate
    "driver_root",  # discover's --driver-root
    "kubeconfig",
    "plugin_registry_dir",
    "plugin_data_dir",
    "cdi_root",
    "state_dir",
    "host_driver_root",
    "pod_uid",
    "healthz_port",
    "healthz_address",
    "log_level",
    "rediscover_interval",
    "health_config",
    "metrics_address",
    "time_slicing_settings",  # applied at prepare, not published
    "node_labels",  # the Node's labels, not its slices
    "telemetry_interval",
    "idle_after",
    "idle_threshold",
}


def test_every_plugin_setting_that_changes_slices_is_a_flag_of_discover() -> None:
    assert set(plugin_settings.ENV_VARS) - NOT_IN_SLICES == set(discover_cmd.SLICE_SETTINGS)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    dests = {a.dest for a in sub.choices["discover"]._actions}
    assert set(discover_cmd.SLICE_SETTINGS) <= dests


def test_karpenter_templates_are_the_slices_without_per_gpu_identity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ("--simulate", "h100x8-mig", "--node", "n1", "--mig-mode", "dynamic")
    _, out_json, _ = run(capsys, *argv, "-o", "json")
    rc, out, _ = run(capsys, *argv, "-o", "karpenter")
    assert rc == 0
    assert out.startswith("# Karpenter DynamicResources (NodeOverlay DRA proposal")
    templates = yaml.safe_load(out)["dynamicResources"]["resourceSliceTemplates"]
    published = json.loads(out_json)["items"]
    assert [t["metadata"]["name"] for t in templates] == [s["metadata"]["name"] for s in published]
    for template, obj in zip(templates, published, strict=True):
        spec = template["spec"]
        assert spec["driver"] == "gpu.nvidia.com" and spec["pool"] == {"name": "n1"}
        assert spec.get("sharedCounters") == obj["spec"].get("sharedCounters")
        for mine, theirs in zip(
            spec.get("devices", []), obj["spec"].get("devices", []), strict=True
        ):
            assert mine["name"] == theirs["name"]
            assert mine["capacity"] == theirs["capacity"]
            assert mine.get("consumesCounters") == theirs.get("consumesCounters")
            dropped = set(theirs["attributes"]) - set(mine["attributes"])
            assert dropped == {"uuid", "parentUUID", "resource.kubernetes.io/pciBusID"} & set(
                theirs["attributes"]
            )
            assert dropped  # each device is known by a UUID (its own or its GPU's)
    assert any("sharedCounters" in t["spec"] for t in templates)
    assert any("devices" in t["spec"] for t in templates)


def test_dynamic_mig_devices_carry_binding_conditions_unless_told_the_server_lacks_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ("--simulate", "h100x8-mig", "--node", "n1", "--mig-mode", "dynamic", "-o", "json")

    def conditions(out: str) -> set[tuple[str, ...]]:
        return {
            (*d.get("bindingConditions", ()), *d.get("bindingFailureConditions", ()))
            for s in json.loads(out)["items"]
            for d in s["spec"].get("devices", [])
        }

    _, served, _ = run(capsys, *argv)
    _, old, _ = run(capsys, *argv, "--binding-conditions", "false")
    _, static, _ = run(capsys, "--simulate", "a100x4-mig", "--node", "n1", "-o", "json")
    assert conditions(served) == {("gpu.nvidia.com/mig-created", "gpu.nvidia.com/mig-failed")}
    assert conditions(old) == conditions(static) == {()}  # static MIG devices exist already
    rc, _, err = run(capsys, *argv, "--binding-conditions", "yes")
    assert rc == 2 and "--binding-conditions must be true or false, got 'yes'" in err


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
