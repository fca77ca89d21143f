"""Prepare latency and throughput of the kubelet plugin, against the local API server.

Usage: ``.venv/bin/python bench/prepare.py [--samples N] [--rounds R] [--server KIND] [--metrics]``

Set-up (not timed): a local control plane (``e2e.cluster.Cluster``), a node simulated with ten
H200 GPUs in MIG mode (7 x ``1g.18gb`` each: 70 MIG devices), the real kubelet plugin publishing
them, and 64 pods whose ResourceClaimTemplate asks for one MIG device, scheduled and allocated
by the real scheduler. The benchmark then acts as the kubelet over the DRA unix socket:

- latency: N single-claim NodePrepareResources calls, one after another (each claim is
  unprepared before it is prepared again, so every call does the full work: GET the claim,
  plan, CDI spec, checkpoint); p50 and p99, and the same for unprepare;
- throughput: R rounds of 64 calls (one claim each, like 64 pods starting) sent at once from
  64 threads; claims/s = 64 / (last answer - first send).

``--server plugin`` (default) measures ``dra-gpu kubelet-plugin`` as deployed (its DRA calls are
serialized node-wide by a file lock); ``standalone`` measures
``bench/standalone_dra_server.py`` on the same state, which has no such lock. ``--metrics``
measures the plugin without and then with ``--metrics-address`` (the cost of ``/metrics`` on
prepare). ``--telemetry`` measures the plugin with ``/metrics`` and GPU telemetry off, then with
telemetry every second on all 70 devices (the cost of the telemetry loop on prepare, paired).

Targets on this 2-core machine: p50 < 10 ms, p99 < 50 ms, >= 100 claims/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from dra_gpu.controller import classes  # noqa: E402
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc  # noqa: E402
from e2e import procs, waiting  # noqa: E402
from e2e.cluster import SIMULATED_TOLERATION, Cluster  # noqa: E402
from e2e.kube_json import as_body  # noqa: E402
from e2e.kubelet_calls import call  # noqa: E402

CLAIMS = 64
TARGET_P50_MS, TARGET_P99_MS, TARGET_RATE = 10.0, 50.0, 100.0
WAIT_S = 180.0  # set-up steps (not timed) on a busy machine
PROFILE = {
    "gpus": [
        {
            "product": "H200-141GB",
            "count": 10,
            "mig": {
                "enabled": True,
                "devices": [{"profile": "1g.18gb", "placement": p} for p in range(7)],
            },
        }
    ]
}


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


# kind -> its --telemetry-interval (``--telemetry``: off, then every second).
TELEMETRY_FLAGS = {"metrics, telemetry off": "0", "metrics, telemetry every 1 s": "1"}


@contextlib.contextmanager
def servers(cluster: Cluster, node: str, root: Path, kind: str) -> Iterator[Path]:
    """The kubelet plugin (publishes the slices); yields the DRA socket to measure."""
    from e2e.driver import PluginDirs, plugin_argv

    profile = root / "bench-mig.json"
    profile.write_text(json.dumps(PROFILE))
    port, metrics_port = procs.free_ports(2)
    dirs = PluginDirs.under(root)
    env = {"PATH": "/usr/bin:/bin"}
    metrics: tuple[str, ...] = ()
    if kind == "metrics" or kind in TELEMETRY_FLAGS:
        metrics = ("--metrics-address", f"127.0.0.1:{metrics_port}")
    if kind in TELEMETRY_FLAGS:
        metrics = (*metrics, "--telemetry-interval", TELEMETRY_FLAGS[kind])
    argv = plugin_argv(
        node_name=node,
        kubeconfig=cluster.kubeconfig,
        profile=str(profile),
        dirs=dirs,
        healthz_port=port,
        extra=("--log-level", "WARNING", *metrics),
    )
    plugin = procs.spawn(argv, log_path=root / "plugin.log", env=env)
    started = [plugin]

    def plugin_healthy() -> bool:
        if plugin.poll() is not None:
            raise RuntimeError((root / "plugin.log").read_text()[-2000:])
        return healthy(port)

    try:
        waiting.wait_for("the plugin", plugin_healthy, timeout=WAIT_S)
        socket = dirs.data / "dra.sock"
        if kind == "standalone":
            socket = root / "standalone.sock"
            started.append(
                procs.spawn(
                    [
                        sys.executable,
                        str(Path(__file__).with_name("standalone_dra_server.py")),
                        *("--node-name", node, "--simulate", str(profile)),
                        *("--cdi-root", str(dirs.cdi_root), "--state-dir", str(dirs.state)),
                        "--socket",
                        str(socket),
                        "--kubeconfig",
                        str(cluster.kubeconfig),
                    ],
                    log_path=root / "standalone.log",
                    env=env,
                )
            )
            waiting.wait_for("the standalone server", socket.exists, timeout=WAIT_S)
        yield socket
    finally:
        procs.stop_many(started)


def make_claims(cluster: Cluster, node: str, device_class: str = classes.MIG_CLASS) -> list[Any]:
    """64 pods on ``node`` (in the namespace of that name) with a claim for one device of
    ``device_class`` each, scheduled; returns their claims as v1 Claim messages."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = cluster.api_client()
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    for desired in classes.builtin_classes(extended_resource_name=None):
        with contextlib.suppress(ApiException):
            resource.create_device_class(as_body(desired.body()))
    ns = node
    cluster.create_namespace(ns)
    request = {"name": "dev", "exactly": {"deviceClassName": device_class, "count": 1}}
    template = {
        "metadata": {"name": "one-device"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    resource.create_namespaced_resource_claim_template(ns, as_body(template))
    container = {"name": "c", "image": "pause", "resources": {"claims": [{"name": "g"}]}}
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [dict(SIMULATED_TOLERATION)],  # the node is simulated
        "containers": [container],
        "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "one-device"}],
    }
    for i in range(CLAIMS):
        core.create_namespaced_pod(ns, as_body({"metadata": {"name": f"p{i}"}, "spec": spec}))

    def allocated() -> list[Any] | None:
        items = resource.list_namespaced_resource_claim(ns).items
        done = [c for c in items if c.status and c.status.allocation]
        if len(done) < CLAIMS:
            return None
        claims = []
        for c in done:
            meta = c.metadata
            assert meta is not None and meta.uid and meta.name  # the API server sets both
            claims.append(dra_v1_pb2.Claim(uid=meta.uid, namespace=ns, name=meta.name))
        return claims

    return waiting.wait_for(f"{CLAIMS} allocated claims", allocated, timeout=WAIT_S)


def latency(socket: Path, claims: Sequence[Any], samples: int) -> tuple[list[float], list[float]]:
    prepare, unprepare = [], []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for i in range(samples + 5):
            claim = claims[i % len(claims)]
            t0 = time.perf_counter()
            call(stub, "prepare", claim)
            t1 = time.perf_counter()
            call(stub, "unprepare", claim)
            t2 = time.perf_counter()
            if i >= 5:  # warm-up: connections, caches
                prepare.append((t1 - t0) * 1e3)
                unprepare.append((t2 - t1) * 1e3)
    return prepare, unprepare


def at_once(socket: Path, claims: Sequence[Any], method: str = "prepare") -> float:
    """One ``method`` call per claim, all sent at once from as many threads; claims/s.

    The other half of the cycle (unprepare after a timed prepare, prepare before a timed
    unprepare) runs one call at a time, off the clock.
    """
    channels = [grpc.insecure_channel(f"unix://{socket}") for _ in claims]
    stubs = [dra_v1_pb2_grpc.DRAPluginStub(c) for c in channels]
    for stub in stubs:  # connect before the clock starts
        stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=30)
    if method == "unprepare":
        for stub, claim in zip(stubs, claims, strict=True):
            call(stub, "prepare", claim)
    barrier = threading.Barrier(len(claims) + 1)
    ends: list[float] = []
    errors: list[BaseException] = []

    def run(stub: Any, claim: Any) -> None:
        barrier.wait()
        try:
            call(stub, method, claim)
        except BaseException as exc:
            errors.append(exc)
        ends.append(time.perf_counter())

    threads = [threading.Thread(target=run, args=a) for a in zip(stubs, claims, strict=True)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = max(ends) - start
    if method == "prepare":
        for stub, claim in zip(stubs, claims, strict=True):
            call(stub, "unprepare", claim)
    for c in channels:
        c.close()
    if errors:
        raise RuntimeError(f"{len(errors)} {method} calls failed, first: {errors[0]}")
    return len(claims) / elapsed


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(kind: str, prep: list[float], unprep: list[float], rates: list[float]) -> None:
    p50, p99 = pct(prep, 0.5), pct(prep, 0.99)
    name = "plugin with /metrics" if kind == "metrics" else kind
    name = f"plugin with {kind}" if kind in TELEMETRY_FLAGS else name
    print(f"server: {name}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(
        f"prepare, single-claim calls (n={len(prep)}): p50 {p50:.2f} ms "
        f"(target < {TARGET_P50_MS:.0f}: {'OK' if p50 < TARGET_P50_MS else 'OVER'}), "
        f"p99 {p99:.2f} ms (target < {TARGET_P99_MS:.0f}: "
        f"{'OK' if p99 < TARGET_P99_MS else 'OVER'}), max {max(prep):.2f} ms"
    )
    print(f"unprepare: p50 {pct(unprep, 0.5):.2f} ms, p99 {pct(unprep, 0.99):.2f} ms")
    best, med = max(rates), statistics.median(rates)
    print(
        f"{CLAIMS} claims at once: " + ", ".join(f"{r:.0f}" for r in rates) + " claims/s; "
        f"median {med:.0f} (target >= {TARGET_RATE:.0f}: "
        f"{'OK' if med >= TARGET_RATE else 'UNDER'}), best {best:.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server", choices=["plugin", "standalone", "both"], default="both")
    parser.add_argument(
        "--metrics", action="store_true", help="the plugin without, then with --metrics-address"
    )
    parser.add_argument(
        "--telemetry",
        action="store_true",
        help="the plugin with /metrics, telemetry off, then telemetry every second",
    )
    args = parser.parse_args()
    node = f"bench-{uuid.uuid4().hex[:6]}"
    kinds = ["plugin", "standalone"] if args.server == "both" else [args.server]
    if args.metrics:
        kinds = ["plugin", "metrics"]
    if args.telemetry:
        kinds = list(TELEMETRY_FLAGS)
    claims: list[Any] = []  # made once, with the first server; the second reuses them
    with Cluster() as cluster, tempfile.TemporaryDirectory(prefix="pb-") as tmp:
        cluster.register_node(node)
        for kind in kinds:
            root = Path(tmp) / f"k{kinds.index(kind)}"  # short: unix socket paths
            root.mkdir()
            with servers(cluster, node, root, kind) as socket:
                claims = claims or make_claims(cluster, node)
                prep, unprep = latency(socket, claims, args.samples)
                rates = [at_once(socket, claims) for _ in range(args.rounds)]
            report(kind, prep, unprep, rates)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
