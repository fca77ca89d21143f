"""``python -m e2e.gpu.demo`` (``make demo-gpu``): a real GPU, through the whole chain, to a pod.

On a machine with an NVIDIA GPU and its driver: a local control plane (real scheduler and
controller-manager), one real node (containerd with CDI + runc + kubelet), the kubelet plugin on
the NVML backend (writing GPU Feature Discovery's labels on its Node, ``--node-labels true``, and
serving ``/readyz``) and the controller. Then, in namespace ``gpu-demo``:

1. Once the devices are published, the Node's labels (``e2e.gpu.gfd_labels``; every
   ``nvidia.com/`` label printed): ``gpu.product``, ``gpu.count`` and ``gpu.memory`` equal what
   the ResourceSlices say, every ``nvidia.com/`` label is what ``dra_gpu.devices.node_labels``
   computes from the published devices, and the plugin added no label outside ``nvidia.com/``.
2. ``dra-gpu validate --node gpu-node`` (``e2e.gpu.validate_node``; its output printed): it exits
   0 with PASS for node, plugin, slices, pod and cdi, its check pod's ``nvidia-smi -L`` names the
   allocated GPU's UUID, the Node gets ``gpu.nvidia.com/validated``; its pods and claim are gone
   before the next step.
3. ``cuda-one`` asks for one ``gpu.nvidia.com`` device through a ResourceClaimTemplate, and
   ``cuda-none`` asks for nothing. Each runs ``gpucheck`` (the CUDA driver API: device count,
   name, UUID, memory) and ``nvidia-smi -L`` from the driver root, which reaches the container only
   through the claim's CDI spec. Checks: ``cuda-one`` sees exactly one device whose UUID is the
   allocated device's ``uuid`` attribute in the ResourceSlice, and ``nvidia-smi -L`` lists that
   GPU alone; ``cuda-none`` sees no CUDA device.
4. Both pods are deleted: the generated claim is gone and its CDI spec removed.
5. ``shared-a`` and ``shared-b`` use one ResourceClaim: both see the same GPU.
6. Prepare latency on NVML: the harness acts as the kubelet on the shared claim's socket,
   ``--prepares`` unprepare + prepare cycles (the running pods keep their devices: a container's
   devices are fixed when it starts), ending prepared as the kubelet left it.
7. Everything is deleted: no CDI spec and no checkpoint record remain.

It prints a table of what each container saw, the figures and its sections (the node labels,
validate's output, telemetry, shares), writes them as JSON (``--out``), and exits 0 only if
every check held. Nothing here changes a GPU setting: it only reads NVML, bind-mounts device
nodes and runs CUDA's read-only queries.

Budgets (``--wait``) start after the step they wait for has started, never before a build.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dra_gpu
from dra_gpu import DRIVER_NAME
from dra_gpu.controller.classes import GPU_CLASS
from e2e.cluster import Cluster
from e2e.driver import Driver, PluginProcess, controller_process
from e2e.gpu import claim_facts, gfd_labels, image, share_pods, telemetry_pods, validate_node
from e2e.images import node_images as images
from e2e.kubelet_calls import prepare_cycles
from e2e.node.kubelet_node import Node
from e2e.procs import free_ports
from e2e.suite import node_labels as gfd_node_labels
from e2e.suite.kube import RESOURCE, Kube, wait_for

NAMESPACE = "gpu-demo"
NODE_NAME = "gpu-node"
DONE = "check-done"
# What every check pod runs: CUDA's view, nvidia-smi's, its device metadata files, then its
# workload (by default none: it stays up for the harness).
SCRIPT = (
    "gpucheck; echo nvidia-smi:; nvidia-smi -L 2>&1; "
    f"{claim_facts.METADATA_SCRIPT}; echo {DONE}; exec {{then}}"
)
TELEMETRY_INTERVAL_S = 5.0
IDLE_AFTER_S = 60.0
_DEVICE_RE = re.compile(r"^cuda-device (\d+): uuid=(\S+) memory=(\d+) name=(.*)$", re.MULTILINE)
_SMI_RE = re.compile(r"^GPU \d+: (.*) \(UUID: (GPU-[0-9a-f-]+)\)$", re.MULTILINE)


@dataclass(frozen=True)
class Seen:
    """What one container reported."""

    pod: str
    cuda_devices: int
    cuda_uuids: tuple[str, ...]
    cuda_names: tuple[str, ...]
    smi_uuids: tuple[str, ...]
    log: str


def parse_log(pod: str, log: str) -> Seen:
    count = re.search(r"^cuda-devices: (\d+)$", log, re.MULTILINE)
    devices = _DEVICE_RE.findall(log)
    return Seen(
        pod=pod,
        cuda_devices=int(count[1]) if count else -1,
        cuda_uuids=tuple(d[1] for d in devices),
        cuda_names=tuple(d[3] for d in devices),
        smi_uuids=tuple(uuid for _name, uuid in _SMI_RE.findall(log)),
        log=log,
    )


@dataclass
class Report:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, list[str]] = field(default_factory=dict)

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.checks.append((what, ok, detail))
        print(f"[gpu-demo] {'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")

    @property
    def passed(self) -> bool:
        return all(ok for _w, ok, _d in self.checks)


def check_pod(
    name: str, *, claim: dict[str, Any] | None, then: str = "sleep 3600"
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "check",
        "image": image.CHECK_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", SCRIPT.format(then=then)],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if claim is not None:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", **claim}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def one_gpu_request() -> dict[str, Any]:
    return {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}]}


def template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(RESOURCE),
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": one_gpu_request()}},
    }


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(RESOURCE),
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": one_gpu_request()},
    }


def published_devices(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    """Device name -> attributes (plain values) of our driver's slices on ``node``."""
    devices: dict[str, dict[str, Any]] = {}
    for s in kube.slices():
        if s["spec"].get("nodeName") != node or s["spec"].get("driver") != DRIVER_NAME:
            continue
        for d in s["spec"].get("devices", []):
            devices[d["name"]] = claim_facts.plain(d.get("attributes", {}))
    return devices


def allocated(kube: Kube, namespace: str, name: str) -> list[str]:
    found = kube.claim(namespace, name) or {}
    results = found.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return [r["device"] for r in results if r.get("driver") == DRIVER_NAME]


def pod_claim_name(kube: Kube, namespace: str, pod: str) -> str:
    statuses = kube.pod(namespace, pod).get("status", {}).get("resourceClaimStatuses", [])
    return str(statuses[0]["resourceClaimName"]) if statuses else ""


def wait_started(kube: Kube, pods: Sequence[str], *, timeout: float) -> dict[str, float]:
    """Wait until each pod is Running; seconds from its creation (as sent) to Running, measured
    by polling (the API's timestamps have one-second resolution)."""
    sent = time.monotonic()
    running: dict[str, float] = {}

    def all_running() -> bool:
        for pod in pods:
            if pod in running:
                continue
            phase = kube.pod(NAMESPACE, pod).get("status", {}).get("phase")
            if phase in ("Running", "Succeeded"):
                running[pod] = time.monotonic() - sent
            elif phase == "Failed":
                raise RuntimeError(f"pod {pod} failed: {kube.events(NAMESPACE, pod)}")
        return len(running) == len(pods)

    wait_for(f"pods {', '.join(pods)} Running", all_running, timeout=timeout)
    return running


def read_seen(kube: Kube, pod: str, *, timeout: float) -> Seen:
    def complete() -> str | None:
        log = kube.log(NAMESPACE, pod, "check")
        return log if DONE in log else None

    return parse_log(pod, wait_for(f"{pod} to report", complete, timeout=timeout))


def wait_gone(what: str, present: Callable[[], bool], *, timeout: float) -> None:
    wait_for(what, lambda: not present() or None, timeout=timeout)


def checkpoint_claims(path: Path) -> int:
    if not path.is_file():
        return 0
    return len(json.loads(path.read_text()).get("claims", {}))


def detect_driver_root() -> Path:
    """``/usr/local/nvidia`` where the driver is laid out there (GKE, these GPU machines), else
    ``/`` (a host install)."""
    local = Path("/usr/local/nvidia")
    return local if any((local / "lib64").glob("libcuda.so.*")) else Path("/")


def nvml_present() -> str | None:
    """None if NVML answers, else why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as e:  # NVMLError, missing library: the demo cannot run, say why
        return f"NVML unavailable: {e}"
    return None if count else "NVML sees no GPU"


def check_labels(
    report: Report,
    kube: Kube,
    node: Node,
    devices: dict[str, dict[str, Any]],
    *,
    before: dict[str, str],
    wanted: gfd_labels.Wanted,
    args: argparse.Namespace,
) -> None:
    """GPU Feature Discovery's labels the plugin wrote on the Node (``e2e.gpu.gfd_labels``):
    ``before``, the Node's labels before the plugin started; ``wanted``, what the driver
    computes from the devices discovered."""
    seen = gfd_labels.observe(kube, node.name, before=before, timeout=args.wait)
    uuids = {name: str(attrs.get("uuid", "")) for name, attrs in devices.items()}
    for what, ok, detail in gfd_labels.judge(seen, wanted, uuids):
        report.check(what, ok, detail)
    report.sections[f"GFD node labels of {node.name} (the plugin, --node-labels true)"] = (
        gfd_labels.lines(seen)
    )


def check_validate(
    report: Report,
    kube: Kube,
    node: Node,
    plugin: PluginProcess,
    devices: dict[str, dict[str, Any]],
    *,
    kubeconfig: Path,
    args: argparse.Namespace,
) -> None:
    """``dra-gpu validate --node`` against the real GPU (``e2e.gpu.validate_node``); returns once
    its pods and claim are gone."""
    command = validate_node.argv(
        node=node.name,
        kubeconfig=kubeconfig,
        namespace=NAMESPACE,
        readyz_url=f"http://127.0.0.1:{plugin.healthz_port}/readyz",
        image=image.CHECK_IMAGE,
        cdi_root=node.cdi_root,
        timeout_s=args.wait,
    )
    # Each of its waits is bounded by --timeout; a pod and up to three CDI pods, each deleted.
    ran = validate_node.run(command, timeout_s=8 * args.wait + 60)
    report.sections[f"dra-gpu validate --node {node.name}"] = validate_node.lines(ran)
    uuids = {name: str(attrs.get("uuid", "")) for name, attrs in devices.items()}
    for what, ok, detail in validate_node.judge(ran, uuids):
        report.check(what, ok, detail)
    labels = gfd_node_labels.node_labels_of(kube, node.name)
    report.check(*validate_node.judge_recorded(labels, dra_gpu.__version__))
    wait_gone(
        "validate's pods and claim to be deleted",
        lambda: bool(validate_node.leftovers(kube, NAMESPACE)),
        timeout=args.wait,
    )


def run(
    kube: Kube,
    node: Node,
    plugin: PluginProcess,
    args: argparse.Namespace,
    *,
    kubeconfig: Path,
    labels_before: dict[str, str],
) -> Report:
    """The steps; ``labels_before``: the Node's labels before the plugin started."""
    report = Report()
    devices = published_devices(kube, node.name)
    report.check("devices published from NVML", bool(devices), ", ".join(sorted(devices)))
    wanted = gfd_labels.discover(args.driver_root)
    check_labels(report, kube, node, devices, before=labels_before, wanted=wanted, args=args)
    kube.create_namespace(NAMESPACE)
    check_validate(report, kube, node, plugin, devices, kubeconfig=kubeconfig, args=args)
    kube.create(NAMESPACE, template("one-gpu"))
    kube.create(NAMESPACE, check_pod("cuda-one", claim={"resourceClaimTemplateName": "one-gpu"}))
    kube.create(NAMESPACE, check_pod("cuda-none", claim=None))
    started = wait_started(kube, ["cuda-one", "cuda-none"], timeout=args.wait)
    report.figures["pod_created_to_running_gpu_s"] = started["cuda-one"]
    report.figures["pod_created_to_running_nogpu_s"] = started["cuda-none"]
    one, none = (read_seen(kube, p, timeout=args.wait) for p in ("cuda-one", "cuda-none"))
    report.seen += [one, none]
    claim_name = pod_claim_name(kube, NAMESPACE, "cuda-one")
    names = allocated(kube, NAMESPACE, claim_name)
    device = devices.get(names[0], {}) if len(names) == 1 else {}
    report.device = {"name": names[0] if names else "", **device}
    uuid = str(device.get("uuid", ""))
    report.check("cuda-one's claim has one device of ours", len(names) == 1, ", ".join(names))
    report.check(
        "CUDA in cuda-one sees exactly the allocated GPU",
        one.cuda_devices == 1 and one.cuda_uuids == (uuid,),
        f"{one.cuda_devices} device(s) {one.cuda_uuids}, allocated {uuid}",
    )
    report.check(
        "nvidia-smi -L in cuda-one lists exactly that GPU",
        one.smi_uuids == (uuid,),
        str(one.smi_uuids),
    )
    report.check("cuda-none sees no CUDA device", none.cuda_devices == 0, str(none.cuda_devices))
    if uuid:
        for found in claim_facts.check(
            claim=kube.claim(NAMESPACE, claim_name) or {},
            device=names[0],
            published=device,
            log=one.log,
            nvml=claim_facts.nvml_facts(uuid),
        ):
            report.check(found.what, found.ok, found.detail)
    claim_uid = str((kube.claim(NAMESPACE, claim_name) or {}).get("metadata", {}).get("uid"))
    spec_named = [p for p in node.cdi_specs() if claim_uid in p.name]
    kube.delete_pods(NAMESPACE, ["cuda-one", "cuda-none"])
    wait_gone(
        "cuda-one's claim to be deleted",
        lambda: kube.claim(NAMESPACE, claim_name) is not None,
        timeout=args.wait,
    )
    wait_gone(
        "cuda-one's CDI spec to be removed",
        lambda: any(p.exists() for p in spec_named),
        timeout=args.wait,
    )
    report.check("unprepare removed cuda-one's CDI spec", bool(spec_named), str(spec_named))

    kube.create(NAMESPACE, claim("shared"))
    # shared-a keeps the GPU busy, shared-b holds memory and does nothing: telemetry by pod.
    workloads = {
        "shared-a": f"gpucheck load {telemetry_pods.BUSY_MIB}",
        "shared-b": f"gpucheck hold {telemetry_pods.IDLE_MIB}",
    }
    for pod, then in workloads.items():
        kube.create(NAMESPACE, check_pod(pod, claim={"resourceClaimName": "shared"}, then=then))
    wait_started(kube, ["shared-a", "shared-b"], timeout=args.wait)
    a, b = (read_seen(kube, p, timeout=args.wait) for p in ("shared-a", "shared-b"))
    report.seen += [a, b]
    shared = allocated(kube, NAMESPACE, "shared")
    shared_uuid = str(devices.get(shared[0], {}).get("uuid", "")) if len(shared) == 1 else ""
    report.check(
        "shared-a and shared-b both see the shared claim's GPU",
        a.cuda_uuids == b.cuda_uuids == (shared_uuid,),
        f"{a.cuda_uuids} {b.cuda_uuids}, allocated {shared_uuid}",
    )
    telemetry = telemetry_pods.observe(
        kube,
        url=f"http://127.0.0.1:{args.metrics_port}/metrics",
        namespace=NAMESPACE,
        claim="shared",
        busy="shared-a",
        idle="shared-b",
        idle_after_s=IDLE_AFTER_S,
        interval_s=TELEMETRY_INTERVAL_S,
    )
    report.checks += telemetry.checks
    report.sections["telemetry by pod (shared-a busy, shared-b idle)"] = telemetry.lines
    report.sections["dra-gpu top"] = telemetry.top.splitlines()
    shared_claim = kube.claim(NAMESPACE, "shared") or {}
    latencies = prepare_cycles(
        plugin.dirs.data / "dra.sock",
        uid=shared_claim["metadata"]["uid"],
        namespace=NAMESPACE,
        name="shared",
        cycles=args.prepares,
    )
    report.figures["nvml_prepare_p50_ms"] = statistics.median(latencies.prepare_ms)
    report.figures["nvml_prepare_max_ms"] = max(latencies.prepare_ms)
    report.figures["nvml_unprepare_p50_ms"] = statistics.median(latencies.unprepare_ms)
    report.figures["nvml_prepares"] = len(latencies.prepare_ms)
    kube.delete_pods(NAMESPACE, ["shared-a", "shared-b"])
    wait_gone(
        "the shared pods to be deleted",
        lambda: kube.pod_exists(NAMESPACE, "shared-a") or kube.pod_exists(NAMESPACE, "shared-b"),
        timeout=args.wait,
    )
    kube.custom.delete_namespaced_custom_object(*RESOURCE, NAMESPACE, "resourceclaims", "shared")
    checkpoint = plugin.dirs.state / "checkpoint.json"
    wait_gone(
        "every CDI spec and checkpoint record to go",
        lambda: bool(node.cdi_specs()) or checkpoint_claims(checkpoint) > 0,
        timeout=args.wait,
    )
    report.check(
        "nothing left: no CDI spec, empty checkpoint",
        not node.cdi_specs() and checkpoint_claims(checkpoint) == 0,
    )
    return report


def print_report(report: Report) -> None:
    print("\npod        CUDA devices  UUID (CUDA)                                 nvidia-smi -L")
    for seen in report.seen:
        uuids = ",".join(seen.cuda_uuids) or "-"
        smi = ",".join(seen.smi_uuids) or "-"
        print(f"{seen.pod:<10} {seen.cuda_devices:>12}  {uuids:<43} {smi}")
    print("\nallocated device:", json.dumps(report.device, sort_keys=True))
    for key, value in report.figures.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    for title, lines in report.sections.items():
        print(f"\n{title}:")
        for line in lines:
            print(f"  {line}")
    for seen in report.seen:
        print(f"\n--- log of {seen.pod} ---\n{seen.log.rstrip()}")
    failed = [w for w, ok, _d in report.checks if not ok]
    print(f"\n{len(report.checks) - len(failed)} passed, {len(failed)} failed")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.gpu.demo", description=__doc__)
    parser.add_argument("--driver-root", type=Path, default=None)
    parser.add_argument("--prepares", type=int, default=20)
    parser.add_argument("--wait", type=float, default=120.0, help="seconds per wait")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument(
        "--slack", type=int, default=2048, help="MiB below its share a share's client may stop at"
    )
    args = parser.parse_args(argv)
    args.metrics_port, healthz_port = free_ports(2)
    why = nvml_present()
    if why is not None:
        print(f"[gpu-demo] cannot run: {why}", file=sys.stderr)
        return 2
    args.driver_root = driver_root = args.driver_root or detect_driver_root()
    workdir = Path(tempfile.mkdtemp(prefix="dra-gpu-demo-"))
    check_archive = image.ensure_check_image(images.cache_dir())
    with Cluster(workdir=workdir / "cluster") as cluster:
        node = Node(cluster, name=NODE_NAME).up()
        try:
            node.import_archives({image.CHECK_IMAGE: check_archive})
            kube = Kube(cluster.api_client())
            controller = controller_process(
                kubeconfig=cluster.kubeconfig, log_path=node.paths.logs / "controller.log"
            )
            telemetry_flags = (
                *("--metrics-address", f"127.0.0.1:{args.metrics_port}"),
                *("--telemetry-interval", f"{TELEMETRY_INTERVAL_S:g}s"),
                *("--idle-after", f"{IDLE_AFTER_S:g}s"),
            )
            # /readyz for validate's --plugin-readyz; GFD's labels on the Node, as the chart's
            # default does (docs/user/node-pools.md).
            plugin = PluginProcess.for_node(
                node,
                kubeconfig=cluster.kubeconfig,
                profile=None,
                healthz_port=healthz_port,
                extra=(
                    *("--driver-root", str(driver_root), *telemetry_flags),
                    *gfd_node_labels.FLAGS,
                ),
            )
            labels_before = gfd_node_labels.node_labels_of(kube, node.name)
            controller.start()
            plugin.start()
            try:
                started = time.monotonic()
                Driver(controller, {node.name: plugin}).wait_ready(kube, timeout=args.wait)
                published_s = time.monotonic() - started
                report = run(
                    kube,
                    node,
                    plugin,
                    args,
                    kubeconfig=cluster.kubeconfig,
                    labels_before=labels_before,
                )
                report.figures["plugin_start_to_published_s"] = published_s
                # The same node's plugin again, publishing consumable shares enforced by MPS.
                plugin.stop()
                plugin = PluginProcess.for_node(
                    node,
                    kubeconfig=cluster.kubeconfig,
                    profile=None,
                    extra=(
                        *("--driver-root", str(driver_root)),
                        *("--consumable-shares", "memory", "--mps-support", "true"),
                    ),
                )
                plugin.start()
                plugin.wait_registered(timeout=args.wait)
                wait_for(
                    "consumable GPUs published",
                    lambda: share_pods.consumable_published(kube, node.name),
                    timeout=args.wait,
                )
                shares = share_pods.run(
                    kube,
                    namespace=NAMESPACE,
                    wait_started=lambda pods: wait_started(kube, pods, timeout=args.wait),
                    log=lambda pod, container: kube.log(NAMESPACE, pod, container),
                    timeout=args.wait,
                    slack_mib=args.slack,
                )
                report.checks += shares.checks
                report.sections["consumable shares (40Gi and 20Gi of one GPU, MPS)"] = shares.lines
            except BaseException:
                print(plugin.log_tail(60), file=sys.stderr)
                raise
            finally:
                plugin.stop()
                controller.stop()
        finally:
            node.down()
    print_report(report)
    if args.out is not None:
        args.out.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
