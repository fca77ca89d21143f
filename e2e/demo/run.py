"""``make demo``: the driver on simulated GPUs in a local cluster, from a fresh clone.

``python -m e2e.demo`` (what ``make demo`` runs):

1. stops a demo left running, then starts the environment in the background (``e2e.demo.env``:
   control plane, four GPU nodes, a kubelet plugin per node with GPU telemetry, the controller
   with its admission webhook), showing its progress; the first run builds the Kubernetes
   binaries (and, with real nodes, containerd and runc);
2. applies the telemetry example first (``e2e.demo.telemetry``: a busy and an idle GPU, so that
   the idle one's idle period passes meanwhile), then example claims and pods from
   ``e2e/scenarios/`` (one namespace each, kept off the shares node); an example the admission
   webhook refuses gets a row saying why, as ``kubectl apply`` would;
3. waits until each pod is scheduled and its claims allocated; then reads what each container
   saw: on a real node from the container's log, on a simulated node by calling
   NodePrepareResources as the kubelet would and resolving the returned CDI device IDs; then the
   dynamic-MIG example (``e2e.demo.dynamic_mig``) and the time-slicing example
   (``e2e.demo.sharing``: the ``nvidia-smi`` commands recorded at prepare, and after its pod is
   deleted the reset), and the consumable-shares example (``e2e.demo.shares``: two claims by
   memory on one GPU, each row with its shareID and consumed memory); before the last, the
   node-label example (``e2e.demo.node_labels``: a pod choosing its node by
   ``nvidia.com/gpu.product`` and its GPU by claim), and every node's GFD labels beside its slices;
4. upgrades ``demo-h200-shared``'s driver, 580.159.04 -> 590.48.01 (``e2e.demo.driver_upgrade``: the
   taint during the reload, a prepare refused with the reason, the new version published, the
   taint gone, the prepared claims' specs and records unchanged);
5. prints the table pod → claim → node → device → what the container saw, the node labels, the
   driver upgrade,
   the telemetry section (``dra-gpu top`` and the ``GpuIdle`` Events), and how to explore and
   tear down.
   When a real node did not start, the table's heading and the last lines say so, why, and
   which log tells more; nodes simulated on purpose are named in one last line. Everything
   stays up until ``python -m e2e.demo down``.

``python -m e2e.demo status`` prints the running demo's kubeconfig and nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes.client import ApiException

from e2e import supervisor
from e2e.cluster import SIMULATED_TOLERATION
from e2e.demo import driver_upgrade as demo_driver_upgrade
from e2e.demo import dynamic_mig as demo_dynamic_mig
from e2e.demo import env as demo_env
from e2e.demo import node_labels as demo_node_labels
from e2e.demo import shares as demo_shares
from e2e.demo import sharing as demo_sharing
from e2e.demo import telemetry as demo_telemetry
from e2e.demo import view as demo_view
from e2e.demo.env import DemoState, NodeInfo
from e2e.suite import node_labels
from e2e.suite.kube import Kube, WaitTimeout, load_manifests, wait_for
from e2e.suite.views import LogIncomplete, extended_requests, parse_report

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS_DIR = REPO_ROOT / "e2e" / "scenarios"
# Shown in this order; together they fit the nodes' GPUs (8 H200, A100s with MIG, H100s). The last
# is bad input: the admission webhook refuses it.
DEMO_SCENARIOS = (
    "one-gpu",
    "two-gpus",
    "gpu-by-product",
    "gpu-by-memory",
    "mig-by-profile",
    "gpu-config",
    "shared-by-containers",
    "shared-by-pods",
    "invalid-config",
)
NAMESPACE_PREFIX = "demo-"
# The scenarios stay off the shares node: its GPUs are the shares and telemetry examples'.
OFF_THE_SHARES_NODE = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "NotIn",
                                "values": [demo_env.SHARES_NODE],
                            }
                        ]
                    }
                ]
            }
        }
    }
}
WAIT_S = 120.0


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ----- the background environment ------------------------------------------------------------


def start_environment() -> DemoState:
    """Start the supervisor and follow its log until the environment is ready."""
    demo_env.state_file().unlink(missing_ok=True)
    log = demo_env.supervisor_log()
    started = time.monotonic()
    proc = supervisor.start(demo_env.MODULE, log)
    try:
        state = supervisor.follow(proc, log, demo_env.read_state)
    except supervisor.SupervisorExited:
        raise SystemExit(f"the demo environment failed to start (log: {log})") from None
    _err(f"[demo] environment ready in {time.monotonic() - started:.0f} s")
    return state


def stop_environment() -> bool:
    """Stop a running demo; True if one was running."""
    state = demo_env.read_state()
    if state is None:
        return False
    pid = state.pid
    supervisor.stop(pid, running=lambda: demo_env.read_state() is not None or demo_env.alive(pid))
    return True


# ----- applying the examples and observing them ----------------------------------------------


def apply_scenarios(kube: Kube, state: DemoState) -> list[tuple[str, str] | demo_view.Row]:
    """Create each scenario in its own namespace. In scenario order: (namespace, pod name) of
    every pod created, and the rows of a scenario the admission webhook refused (its objects
    from the refused one on are not created, as with ``kubectl apply`` stopping there)."""
    real = [n.name for n in state.nodes if n.real]
    entries: list[tuple[str, str] | demo_view.Row] = []
    for name in DEMO_SCENARIOS:
        namespace = NAMESPACE_PREFIX + name
        kube.create_namespace(namespace)
        docs = load_manifests(SCENARIOS_DIR / name)
        for i, doc in enumerate(docs):
            if doc["kind"] == "Pod":
                # Real containers only run on real nodes: keep the pods off simulated ones, or,
                # with none real, let them go to the simulated ones (tainted for anyone else).
                placement = (
                    {"nodeSelector": dict([demo_env.REAL_NODE_LABEL])}
                    if real
                    else {"tolerations": [dict(SIMULATED_TOLERATION)]}
                ) | OFF_THE_SHARES_NODE
                doc = {**doc, "spec": {**doc["spec"], **placement}}
            try:
                kube.create(namespace, doc)
            except ApiException as exc:
                why = demo_view.admission_refusal(exc.body)
                if why is None:
                    raise
                pods = [d["metadata"]["name"] for d in docs[i:] if d["kind"] == "Pod"]
                entries += demo_view.refused_rows(name, doc, pods, why)
                break
            if doc["kind"] == "Pod":
                entries.append((namespace, doc["metadata"]["name"]))
    return entries


def _placed(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod once it is bound and all its claims are allocated (or it is unschedulable)."""
    pod = kube.pod(namespace, name)
    conditions = (pod.get("status") or {}).get("conditions") or []
    if any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions):
        return pod
    if not pod["spec"].get("nodeName"):
        return None
    extended, _ = extended_requests(pod, "")
    for claim_name in [*demo_view.pod_claim_names(pod).values(), *([extended] if extended else [])]:
        claim = kube.claim(namespace, claim_name)
        if not claim or not (claim.get("status") or {}).get("allocation"):
            return None
    return pod


def _claim_cell(kube: Kube, namespace: str, claims: list[str]) -> tuple[str, str]:
    """(claim names, allocated devices) for the table."""
    devices = []
    for name in claims:
        claim = kube.claim(namespace, name) or {}
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        devices += demo_view.device_lines(results.get("results") or [])
    return "\n".join(claims) or "-", "\n".join(devices) or "-"


def _observe_log(kube: Kube, namespace: str, pod: str, container: str) -> str:
    def report() -> str | None:
        try:
            return demo_view.summarize(parse_report(kube.log(namespace, pod, container)))
        except LogIncomplete:
            return None

    return wait_for(f"the log of {namespace}/{pod}/{container}", report, timeout=WAIT_S)


def _observe_cdi(kube: Kube, node: NodeInfo, pod: dict[str, Any], container: dict[str, Any]) -> str:
    from e2e.demo import prepare as demo_prepare

    namespace = pod["metadata"]["namespace"]
    claim_names = demo_view.pod_claim_names(pod)
    # (ResourceClaim name, request or None for all of it) for what this container uses.
    wanted = [
        (claim_names[ref], request)
        for ref, request in demo_view.container_claims(container)
        if ref in claim_names
    ]
    extended, requests = extended_requests(pod, container["name"])
    wanted += [(extended, request) for request in requests]
    claims = {name: kube.claim(namespace, name) or {} for name, _ in wanted}
    prepared = demo_prepare.prepare(
        Path(node.dra_socket),
        [(namespace, c["metadata"]["uid"], name) for name, c in claims.items() if c],
    )
    ids: list[str] = []
    for name, request in wanted:
        result = prepared.get(claims[name].get("metadata", {}).get("uid", ""))
        if result is None:
            continue
        if isinstance(result, str):
            return f"prepare failed: {result}"
        for device in result:
            if request is None or not device.request_names or request in device.request_names:
                ids += [i for i in device.cdi_device_ids if i not in ids]
    specs = demo_prepare.read_cdi_specs(Path(node.cdi_root))
    return demo_view.summarize(demo_view.cdi_view(specs, ids))


def observe(kube: Kube, state: DemoState, namespace: str, name: str) -> list[demo_view.Row]:
    """The table rows of one pod: one per container."""
    try:
        pod = wait_for(
            f"pod {namespace}/{name} to be scheduled",
            lambda: _placed(kube, namespace, name),
            timeout=WAIT_S,
        )
    except WaitTimeout as exc:
        return [demo_view.Row(f"{namespace}/{name}", "-", "-", "-", str(exc), "")]
    node_name = pod["spec"].get("nodeName") or ""
    node = next((n for n in state.nodes if n.name == node_name), None)
    claim_names = demo_view.pod_claim_names(pod)
    rows = []
    containers = pod["spec"]["containers"]
    for container in containers:
        scenario = namespace.removeprefix(NAMESPACE_PREFIX)
        label = f"{scenario}/{name}" + (f" [{container['name']}]" if len(containers) > 1 else "")
        refs = [
            claim_names[r] for r, _ in demo_view.container_claims(container) if r in claim_names
        ]
        extended, requests = extended_requests(pod, container["name"])
        if requests:
            refs.append(extended)
        claim_cell, device_cell = _claim_cell(kube, namespace, refs)
        if node is None:
            saw, source = "Pending: no node has matching free devices", ""
        elif node.real:
            saw, source = _observe_log(kube, namespace, name, container["name"]), "log"
        else:
            saw, source = _observe_cdi(kube, node, pod, container), "cdi"
        rows.append(demo_view.Row(label, claim_cell, node_name or "-", device_cell, saw, source))
    return rows


# ----- output --------------------------------------------------------------------------------


def explore_text(state: DemoState) -> str:
    kubectl = f"{state.kubectl} --kubeconfig {state.kubeconfig}"
    lines = [
        "",
        "Nodes:",
        *(
            f"  {n.name:9} {'real (kubelet + containerd)' if n.real else 'simulated (no kubelet)'}"
            f", SIMULATED GPUs of profile {n.profile}; plugin log {n.plugin_log}"
            + (f"\n            {n.note}" if n.note else "")
            for n in state.nodes
        ),
        "",
        f"Each example runs in namespace {NAMESPACE_PREFIX}<example>; POD is <example>/<pod>.",
        "(log) = read from the container's log; (CDI) = the environment and device nodes the",
        "container would get: NodePrepareResources called as the kubelet would, its CDI device",
        "IDs resolved in the plugin's CDI directory, as the container runtime does.",
        "(admission) = the admission webhook refused the example's claim: nothing was created",
        f"from it on. The webhook: {state.webhook} (controller log {state.controller_log}).",
        "<device> share <id> = the claim's share of a GPU that several claims use (consumable",
        f"shares on {demo_env.SHARES_NODE}, docs/concepts/sharing.md): its shareID's first "
        "characters",
        "and what it consumed, from the claim's allocation.",
        "",
        "Explore:",
        f"  export KUBECONFIG={state.kubeconfig}",
        f"  alias kubectl={state.kubectl}",
        "  kubectl get resourceslices -o wide",
        "  kubectl get deviceclasses",
        "  kubectl get resourceclaims -A",
        "  kubectl get pods -A -o wide",
        f"  ls {' '.join(sorted({n.cdi_root for n in state.nodes}))}",
        "  .venv/bin/python -m dra_gpu top -A "
        + " ".join(f"--metrics-url {n.metrics_url}" for n in state.nodes if n.metrics_url),
        f"  (or, without the alias: {kubectl} get resourceslices)",
        "  # what a node of a profile publishes, before it exists (docs/user/autoscaling.md):",
        "  .venv/bin/python -m dra_gpu discover --simulate h200x8 --node demo-h200 "
        "-o resourceslices",
        "",
        *_health_text(state),
        "Tear down:",
        "  .venv/bin/python -m e2e.demo down",
    ]
    return "\n".join(lines)


def result_text(
    state: DemoState, rows: Sequence[demo_view.Row], sections: Sequence[str] = ()
) -> str:
    """What the demo ends with: the heading, the table, ``sections`` (each after a blank line),
    how to explore; when a real node did not start, the heading starts with why, and the last
    lines say it again (the table and the build output above may have scrolled the heading
    away). Nodes simulated on purpose are named in one last line, with why, and no warning. The
    very last line says the GPUs are simulated, on real nodes too."""
    simulated = [
        demo_view.Simulated(n.name, n.note, n.note_log, on_purpose=n.on_purpose)
        for n in state.nodes
        if not n.real
    ]
    some_real = len(simulated) < len(state.nodes)
    profiles = [n.profile for n in state.nodes]
    head = demo_view.heading(simulated, some_real=some_real, profiles=profiles)
    last = [
        *demo_view.on_purpose_line(simulated),
        *demo_view.fallback_notice(simulated, some_real=some_real),
        demo_view.simulated_gpus_line(profiles),
    ]
    parts = [head, demo_view.render_table(rows), *(f"\n{s}" for s in sections), explore_text(state)]
    return "\n".join([*parts, "", *last])


def _health_text(state: DemoState) -> list[str]:
    """How to show device health: inject an XID on the first node's GPU, see the taint."""
    node = next((n for n in state.nodes if n.state_dir and n.profile == "h200x8"), None)
    if node is None:
        return []
    health = f".venv/bin/python -m dra_gpu health --state-dir {node.state_dir}"
    return [
        "Device health (docs/concepts/device-health.md): an XID on a GPU of node "
        + node.name
        + ":",
        f"  {health} inject gpu-3 xid 79",
        "  kubectl get resourceslices -o yaml | grep -A4 'taints:'",
        f"  {health} clear gpu-3",
        "",
    ]


def cmd_run(_: argparse.Namespace) -> int:
    if stop_environment():
        _err("[demo] stopped the previous demo")
    state = start_environment()
    kube = Kube.from_kubeconfig(state.kubeconfig)
    # First, so that the idle claim's idle period passes while the other examples are applied.
    _err("[demo] applying the telemetry example (a busy and an idle GPU)")
    watched = [r for entry in demo_telemetry.apply(kube) for r in observe(kube, state, *entry)]
    demo_telemetry.make_busy(kube, state)
    _err("[demo] applying example claims and pods from e2e/scenarios/")
    rows: list[demo_view.Row] = []
    for entry in apply_scenarios(kube, state):
        rows += [entry] if isinstance(entry, demo_view.Row) else observe(kube, state, *entry)
    _err("[demo] applying the dynamic MIG example (a MIG device created for its claim)")
    dynamic = observe(kube, state, *demo_dynamic_mig.apply(kube))
    rows += demo_dynamic_mig.with_created(dynamic, state, kube)
    _err("[demo] applying the time-slicing example (the interval set on its GPU, then reset)")
    example = demo_sharing.apply(kube, state)
    shared = observe(kube, state, example.namespace, example.pod)
    rows += demo_sharing.applied_and_reset(shared, kube, state, example)
    _err("[demo] applying the node-label example (a node chosen by nvidia.com/gpu.product)")
    table = node_labels.wait_labelled(kube, [n.name for n in state.nodes])
    rows += observe(kube, state, *demo_node_labels.apply(kube))
    labels = node_labels.section(table)
    _err("[demo] applying the shares example (two claims of 40Gi and 20Gi on one GPU)")
    for entry in demo_shares.apply(kube):
        rows += observe(kube, state, *entry)
    rows += watched
    _err("[demo] reading GPU telemetry: dra-gpu top and the GpuIdle Events")
    telemetry = demo_telemetry.section(demo_telemetry.observe(kube, state))
    _err(f"[demo] upgrading {demo_driver_upgrade.NODE}'s driver: 580.159.04 -> 590.48.01")
    upgrade = demo_driver_upgrade.run(kube, state)
    print()
    print(result_text(state, rows, [labels, upgrade, telemetry]))
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    _err("[demo] stopped" if stop_environment() else "[demo] no demo is running")
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    state = demo_env.read_state()
    if state is None:
        _err("no demo is running; start one with: make demo")
        return 1
    print(
        json.dumps(
            {
                "kubeconfig": state.kubeconfig,
                "kubectl": state.kubectl,
                "nodes": [n.__dict__ for n in state.nodes],
            },
            indent=2,
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="(default) start the demo and print the table").set_defaults(
        func=cmd_run
    )
    sub.add_parser("down", help="stop the demo and remove its files").set_defaults(func=cmd_down)
    sub.add_parser("status", help="where the running demo is").set_defaults(func=cmd_status)
    sub.add_parser("_serve").set_defaults(func=lambda _: demo_env.serve())
    args = parser.parse_args(argv)
    func = getattr(args, "func", cmd_run)
    return int(func(args))


if __name__ == "__main__":
    raise SystemExit(main())
