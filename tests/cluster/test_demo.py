"""``make demo``'s environment, on simulated nodes: what the chart installs, bad input refused.

The demo runs the controller with its admission webhook, registered for the whole cluster like
the chart's ValidatingWebhookConfiguration, so its bad-input example (``invalid-config``) is
refused when it is applied, and its row says so and why, instead of the pod failing at prepare.
With real nodes turned off, the nodes are simulated on purpose: the ending names them and why,
in one line, without a warning. The dynamic-MIG
node's example gets a MIG device created for its claim, and its row shows that device. The
time-slicing example's row shows the interval set on its GPU, and its reset once the pod is gone.
The shares example's two pods get one GPU, each row with its own shareID and consumed memory.
Every demo node carries GFD's labels equal to its slices (the rows of ``kubectl get nodes -L
nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory``), and the pod selecting
``nvidia.com/gpu.product`` by node affinity and a GPU by claim lands on an H200 node and gets
one of its GPUs. The telemetry section shows ``dra-gpu top`` with the busy pod at its
utilization and the idle claim idle, and GpuIdle Events on the idle claim and pod, none on the
busy one.
Scale from zero: for every demo node, ``dra-gpu discover --simulate PROFILE --node NAME -o
resourceslices`` with the node's slice settings prints exactly the slices the node publishes
(names, devices, attributes, capacities, counters), before any example runs.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu import discover_cmd
from dra_gpu.plugin import settings as plugin_settings
from e2e.demo import dynamic_mig as demo_dynamic_mig
from e2e.demo import env as demo_env
from e2e.demo import node_labels as demo_node_labels
from e2e.demo import run as demo
from e2e.demo import shares as demo_shares
from e2e.demo import sharing as demo_sharing
from e2e.demo import telemetry as demo_telemetry
from e2e.demo import view as demo_view
from e2e.suite import node_labels
from e2e.suite.kube import Kube


@pytest.fixture(scope="module")
def environment() -> Iterator[demo_env.Environment]:
    workdir = Path(tempfile.mkdtemp(prefix="demo-"))  # short: plugin sockets live below it
    env = demo_env.Environment(workdir)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DRA_GPU_DEMO_REAL_NODES", "no")
            env.up()
        yield env
    finally:
        env.down()
        shutil.rmtree(workdir, ignore_errors=True)


def discover_argv(node: demo_env.NodeInfo) -> list[str]:
    """``dra-gpu discover`` for a node of this demo node's profile and plugin settings: the
    node's plugin flags that change slices (``discover_cmd.SLICE_SETTINGS``) passed on."""
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    given = vars(parser.parse_args(list(demo_env.NODE_FLAGS.get(node.name, ()))))
    settings = [
        arg
        for dest in discover_cmd.SLICE_SETTINGS
        if given[dest] is not None
        for arg in (f"--{dest.replace('_', '-')}", str(given[dest]))
    ]
    profile = node.profile_file or node.profile
    return ["--simulate", profile, "--node", node.name, "-o", "resourceslices", *settings]


def without_bookkeeping(obj: dict[str, Any]) -> dict[str, Any]:
    """A slice as a node of that profile has it: what the API server and the publisher add (uid,
    owner, annotations, the pool's generation, which counts re-publishes) left out."""
    spec = dict(obj["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return {"name": obj["metadata"]["name"], "spec": spec}


def test_discover_prints_exactly_what_each_demo_node_publishes(
    environment: demo_env.Environment, capsys: pytest.CaptureFixture[str]
) -> None:
    state = environment.state()
    kube = Kube.from_kubeconfig(state.kubeconfig)
    published = kube.slices()
    assert {n.name for n in state.nodes} == set(demo_env.NODE_PROFILES)
    for node in state.nodes:
        argv = discover_argv(node)
        assert discover_cmd.main(argv) == 0, argv
        predicted = [without_bookkeeping(o) for o in yaml.safe_load_all(capsys.readouterr().out)]
        live = sorted(
            (without_bookkeeping(o) for o in published if o["spec"].get("nodeName") == node.name),
            key=lambda o: str(o["name"]),
        )
        assert predicted == live, f"dra-gpu discover {' '.join(argv)}"
    shown = " ".join(discover_argv(next(n for n in state.nodes if n.name == "demo-h200")))
    assert shown == "--simulate h200x8 --node demo-h200 -o resourceslices"


def test_bad_input_is_refused_at_admission_and_the_ending_names_the_simulated_nodes(
    environment: demo_env.Environment,
) -> None:
    state = environment.state()
    kube = Kube.from_kubeconfig(state.kubeconfig)
    entries = demo.apply_scenarios(kube, state)

    refused = [e for e in entries if isinstance(e, demo_view.Row)]
    assert [(r.pod, r.claim, r.source) for r in refused] == [
        ("invalid-config/invalid-config", "ResourceClaimTemplate invalid-config", "admission")
    ]
    assert "mpsConfig" in refused[0].saw
    assert not kube.pod_exists("demo-invalid-config", "invalid-config")
    created = [e for e in entries if not isinstance(e, demo_view.Row)]
    assert ("demo-one-gpu", "one-gpu") in created

    observed = demo.observe(kube, state, *demo_dynamic_mig.apply(kube))
    (row,) = demo_dynamic_mig.with_created(observed, state, kube)
    print(demo_view.render_table([row]))  # as make demo prints it
    assert (row.node, row.source) == (demo_env.DYNAMIC_MIG_NODE, "cdi")
    assert row.devices == "gpu-0-mig-3g40gb-9-4", row  # 3g and larger are placed top-down
    assert "MIG 3g.40gb" in row.saw and "created MIG-" in row.saw, row
    # The claim's device status names the created device (issue 42), the one the row shows.
    (created,) = re.findall(r"created (MIG-\S+)", row.saw)
    assert f"claim status.devices: uuid {created}" in row.saw, row
    # Made before the pod bound (issue 44): the demo's Kubernetes serves binding conditions, the
    # plugin said so at start, and the row shows the condition True no later than the binding.
    dynamic = next(n for n in state.nodes if n.name == demo_env.DYNAMIC_MIG_NODE)
    assert "binding conditions on" in Path(dynamic.plugin_log).read_text()
    (made_at,) = re.findall(r"gpu\.nvidia\.com/mig-created True at (\S+)", row.saw)
    (bound_at,) = re.findall(r"pod bound at (\S+) \(PodScheduled True\)", row.saw)
    assert made_at <= bound_at, row
    (events,) = [line for line in row.saw.splitlines() if line.startswith("pod events: ")]
    reasons = [e.split()[0] for e in events.removeprefix("pod events: ").split(", ")]
    assert reasons.index("BindingConditionsPending") < reasons.index("Scheduled"), row
    assert row.saw.splitlines()[-1] == "mig-created was True before the pod was bound", row

    example = demo_sharing.apply(kube, state)
    observed = demo.observe(kube, state, example.namespace, example.pod)
    (row,) = demo_sharing.applied_and_reset(observed, kube, state, example)
    assert (row.node, row.source) == (demo_env.SHARING_NODE, "cdi"), row
    applied, _, reset = row.saw.partition("pod deleted, unprepare ran (recorded):")
    (uuid,) = re.findall(r"-i (GPU-\S+) --set-timeslice 3", applied)  # Long, on the claimed GPU
    assert reset.split() == ["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", "0"]
    assert not kube.pod_exists(example.namespace, example.pod)

    # Simulated on purpose: said in one line, and no warning.
    ending = demo.result_text(state, refused)
    assert ending.startswith("Pods on simulated nodes (no kubelet)"), ending
    assert ending.splitlines()[-2] == (
        "Simulated on purpose (no kubelet): demo-h200, demo-a100, demo-h100-dyn, "
        "demo-h200-shared, real nodes off (DRA_GPU_DEMO_REAL_NODES=no)."
    )
    # The GPUs are simulated, said above the table, in its columns and in the last line.
    assert ending.splitlines()[-1].startswith("GPUs: SIMULATED on every node"), ending
    assert ending.splitlines()[2].startswith("GPUs: SIMULATED on every node"), ending
    assert "DEVICE (SIMULATED)" in ending
    assert "NO CONTAINER RAN" not in ending


def test_two_shares_on_one_gpu_and_the_telemetry_section(
    environment: demo_env.Environment,
) -> None:
    state = environment.state()
    kube = Kube.from_kubeconfig(state.kubeconfig)
    watched = [r for e in demo_telemetry.apply(kube) for r in demo.observe(kube, state, *e)]
    demo_telemetry.make_busy(kube, state)

    rows = [r for e in demo_shares.apply(kube) for r in demo.observe(kube, state, *e)]
    assert [r.pod for r in rows] == ["shared-by-memory/share-40gi", "shared-by-memory/share-20gi"]
    assert {r.node for r in rows} == {demo_env.SHARES_NODE}
    cells = [r.devices.splitlines() for r in rows]
    assert [c[1] for c in cells] == ["  consumed memory 40Gi", "  consumed memory 20Gi"], cells
    (device,) = {c[0].split()[0] for c in cells}  # one GPU for both
    ids = [c[0].split()[2] for c in cells]
    assert len(set(ids)) == 2 and all(len(i) == demo_view.SHARE_ID_CHARS for i in ids), cells
    assert all(r.saw.startswith(f"{device} NVIDIA H200") for r in rows), rows
    # Claims that ask for nothing take a whole GPU of the shares node: all of its memory.
    assert {r.devices.splitlines()[1] for r in watched} == {"  consumed memory 143771Mi"}

    seen = demo_telemetry.observe(kube, state)
    top = seen.top_output.splitlines()
    assert top[0].split() == [
        "NODE",
        "DEVICE",
        "PRODUCT",
        "CLAIM",
        "PODS",
        "UTIL",
        "MEMORY",
        "IDLE",
    ]
    busy = next(line.split() for line in top if f"{demo_telemetry.NAMESPACE}/busy-" in line)
    idle = next(line.split() for line in top if f"{demo_telemetry.NAMESPACE}/idle-" in line)
    assert tuple(busy[-4:]) == ("busy", "85%", "12.0Gi/140.4Gi", "-"), top
    assert idle[-4:-1] == ["-", "0%", "0/140.4Gi"] and idle[-1] != "-", top
    assert len(top) == 3, top  # the example's two claims only
    involved = sorted(
        (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["type"]) for e in seen.events
    )
    idle_claim = next(t for t in idle if t.startswith(f"{demo_telemetry.NAMESPACE}/"))
    idle_claim = idle_claim.split("/")[1]
    assert involved == [("Pod", "idle", "Warning"), ("ResourceClaim", idle_claim, "Warning")]
    section = demo_telemetry.section(seen)
    assert "(none on pod busy or its claim " in section, section
    ending = demo.result_text(state, [*rows, *watched], [section])
    assert section in ending and ending.index("consumed memory 20Gi") < ending.index(section)


def test_node_labels_equal_the_slices_and_a_pod_selects_its_node_by_them(
    environment: demo_env.Environment,
) -> None:
    state = environment.state()
    kube = Kube.from_kubeconfig(state.kubeconfig)
    table = node_labels.wait_labelled(kube, [n.name for n in state.nodes])
    labelled = {r.node: r.labels for r in table}
    assert labelled["demo-h200"] == ("NVIDIA-H200", "8", "143771")
    assert labelled["demo-a100"] == ("NVIDIA-A100-SXM4-40GB", "4", "40960")
    assert labelled["demo-h100-dyn"][:2] == ("NVIDIA-H100-80GB-HBM3", "8")
    text = node_labels.section(table).splitlines()
    assert text[1] == (
        "  kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory"
    )
    assert text[2].split() == ["NAME", "GPU.PRODUCT", "GPU.COUNT", "GPU.MEMORY", "FROM", "SLICES"]
    h200 = next(line for line in text if line.split()[0] == "demo-h200")
    assert h200.split() == ["demo-h200", "NVIDIA-H200", "8", "143771", "equal"]

    (row,) = demo.observe(kube, state, *demo_node_labels.apply(kube))
    # An H200 node (labelled NVIDIA-H200), though the claim alone would fit others too.
    assert row.node in {"demo-h200", "demo-h200-shared"}, row
    assert re.fullmatch(r"gpu-\d( share \S+)?", row.devices.splitlines()[0]), row
    assert "NVIDIA H200" in row.saw, row
