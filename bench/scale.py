"""Fleet scale: N simulated nodes on the real control plane, and the driver's share of the cost.

Usage: ``.venv/bin/python bench/scale.py [--nodes 100]
[--layouts static,minimal,mig,dynamic-mig,consumable] [--pods K] [--rate 50] [--steady-s 60]
[--workers 2] [--allow-partial] [--scheduler stock|patched]``

``--scheduler patched`` runs a kube-scheduler built with ``docs/upstream/``'s patch to
Kubernetes' DRA CEL evaluator (``e2e.dra_patch``: built once per patch into the binaries cache).

Set-up, once for all layouts (so their figures are comparable): the harness's etcd, API server,
scheduler and controller-manager (``e2e.cluster.Cluster``; the controller-manager's and
scheduler's client rate limits raised, as Kubernetes' scheduler_perf runs them, so that client
throttling does not hide the scheduler's work); kwok (``e2e.kwok``) keeping N Node objects
Ready with their Leases and playing the kubelet for pods bound to them; the driver's controller
(``dra-gpu controller``: it keeps the DeviceClasses) with its admission webhook.

The webhook, once (a claim create does not read slices): ResourceClaim creates (server-side
dry-run, so nothing piles up) sent at a fixed rate for each of ``--webhook-rates``, with the
webhook configured and then without; p50/p99 and errors of each, the difference is what the
webhook adds.

Per layout (``bench/scale_layouts.py``), in the order given:

1. RSS of the API server and etcd, etcd's size in use and the bytes etcd stores for
   ResourceSlices; then ``--workers`` processes of publishers (``bench/scale_publishers.py``,
   which says which code is the product's) are started together: time until every node's
   slices are published; the same memory figures again (their difference: what our slices cost).
2. Steady state, on the first layout (on every one with ``--steady-every``: the publishers make
   the same calls whatever the layout, only their size differs): ``--steady-s`` seconds without
   a workload (default 60: one resync period, so every node's periodic resync falls into it
   once): the API server's ``apiserver_request_total``
   deltas by verb and resource, per node per minute (all clients: kwok, control plane, ours), the
   publishers' own calls (counted by the workers), and the open watches
   (``apiserver_longrunning_requests``).
3. The publishers restarted over their published slices: time until synced, and how many
   slices they wrote (none is right: nothing changed).
4. Workload: K pods (default one per node), each with a claim from one ResourceClaimTemplate for
   one device of the layout, created at ``--rate`` per second; watches on the pods and claims
   record when each is bound and allocated. pods/s = K / (first creation .. last bound); p50/p99
   of pod created -> claim allocated.
5. ``dra-gpu explain`` of the workload's template over the whole cluster (a process; timed).
6. Clean-up: pods, claims and slices deleted (the slices beside the workload) before the next
   layout.

Prints one table (a row per figure, a column per layout) and ends with a line per layout
``LAYOUT: N pods in S s, R pods/s``. A layout that stopped (the memory guard, a publish timeout, a
worker that died) prints ``not measured: <why>`` for each figure it did not reach, never a zero,
and the run exits 1 unless ``--allow-partial``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench import scale_layouts as sl  # noqa: E402
from bench import webhook as wh  # noqa: E402
from bench.plugin_startup import rss_mib  # noqa: E402
from dra_gpu.controller import registration  # noqa: E402
from dra_gpu.controller.classes import GPU_CLASS, MIG_CLASS  # noqa: E402
from dra_gpu.kube import errors  # noqa: E402
from dra_gpu.kube.client import KubeClient, connect  # noqa: E402
from e2e import binaries, dra_patch, helm, kwok, procs, waiting  # noqa: E402
from e2e.cluster import Cluster  # noqa: E402
from e2e.cluster.components import CONTROLLER_MANAGER, SCHEDULER  # noqa: E402

JSON = dict[str, Any]
NODE_PREFIX = "kwok-"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
TEMPLATE = "one-device"
CLIENT_LIMITS = ["--kube-api-qps=1000", "--kube-api-burst=2000"]
# Claim creates per rate: WEBHOOK_SECONDS at the rate, at least WEBHOOK_MIN_CREATES (so that
# p99 is not the slowest of a few).
WEBHOOK_SECONDS = 3.0
WEBHOOK_MIN_CREATES = 250
SENDERS = 24  # threads sending paced creates (webhook and pods)


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ----- the control plane's figures ----------------------------------------------------------


def metric_samples(text: str) -> dict[str, list[sl.Sample]]:
    """Prometheus text -> sample name -> [(labels, value)] (the client library's parser)."""
    out: dict[str, list[sl.Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def apiserver_metrics(cluster: Cluster) -> dict[str, list[sl.Sample]]:
    return metric_samples(cluster.kubectl("get", "--raw", "/metrics"))


def _http(url: str, body: JSON | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=120) as resp:
        answer: bytes = resp.read()
    return answer


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def etcd_stored_bytes(etcd_url: str, prefix: bytes) -> tuple[int, int]:
    """(keys, bytes of their values) under ``prefix``, through etcd's JSON gateway."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    key, keys, size = prefix, 0, 0
    while True:
        reply = json.loads(
            _http(
                f"{etcd_url}/v3/kv/range",
                {"key": _b64(key), "range_end": _b64(end), "limit": 500},
            )
        )
        kvs = reply.get("kvs") or []
        for kv in kvs:
            keys += 1
            size += len(base64.b64decode(kv.get("value", "")))
        if not reply.get("more") or not kvs:
            return keys, size
        key = base64.b64decode(kvs[-1]["key"]) + b"\0"


def etcd_in_use(etcd_url: str) -> float:
    samples = metric_samples(_http(f"{etcd_url}/metrics").decode())
    return sum(v for _, v in samples.get("etcd_mvcc_db_total_size_in_use_in_bytes", []))


def component_pid(cluster: Cluster, binary: str) -> int:
    """The pid of ``binary`` started for this cluster (its work directory is in the argv)."""
    marker = str(cluster.workdir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(binary.encode()) and marker in b" ".join(argv):
                return int(entry.name)
    raise RuntimeError(f"no {binary} of {cluster.workdir} running")


@dataclass
class Memory:
    apiserver_mib: float
    etcd_mib: float
    etcd_in_use_mib: float
    slice_keys: int
    slice_mib: float


def memory(cluster: Cluster, pids: Mapping[str, int]) -> Memory:
    keys, size = etcd_stored_bytes(cluster.layout.etcd_url, b"/registry/resourceslices/")
    return Memory(
        apiserver_mib=rss_mib(pids["kube-apiserver"]),
        etcd_mib=rss_mib(pids["etcd"]),
        etcd_in_use_mib=etcd_in_use(cluster.layout.etcd_url) / 2**20,
        slice_keys=keys,
        slice_mib=size / 2**20,
    )


# ----- nodes ----------------------------------------------------------------------------------


def node_body(name: str) -> JSON:
    key, value = kwok.FAKE_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
    }


def ready_nodes(client: KubeClient) -> int:
    listed = client.request(
        "GET", "/api/v1/nodes", query={"labelSelector": "type=kwok"}, timeout_s=120
    )
    ready = 0
    for node in listed.get("items") or []:
        conditions = (node.get("status") or {}).get("conditions") or []
        ready += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready


def create_nodes(client: KubeClient, names: Sequence[str]) -> None:
    def create(name: str) -> None:
        with contextlib.suppress(errors.AlreadyExists):
            client.request("POST", "/api/v1/nodes", body=node_body(name))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, names))
    waiting.wait_for(
        f"{len(names)} kwok nodes Ready",
        lambda: ready_nodes(client) >= len(names),
        timeout=max(300.0, 1.0 * len(names)),  # kwok readies a few nodes a second here
        every=1.0,
    )


# ----- paced requests -------------------------------------------------------------------------


def paced(count: int, rate: float, send: Callable[[int], None]) -> tuple[list[float], int, float]:
    """``send(i)`` for i < count, started at ``rate`` per second (open loop, SENDERS threads).

    Returns (latency in ms of each successful send, errors, seconds from first to last start)."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()  # guards latencies and failures: appended to by the senders
    starts: list[float] = []

    def one(i: int) -> None:
        begin = time.perf_counter()
        try:
            send(i)
        except errors.ApiError as err:
            with lock:
                failures[0] += 1
                if failures[0] <= 3:
                    log(f"request {i} failed: {err}")
            return
        with lock:
            latencies.append((time.perf_counter() - begin) * 1e3)
            starts.append(begin)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(SENDERS) as pool:
        for i in range(count):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i)
    span = (max(starts) - min(starts)) if len(starts) > 1 else 0.0
    return latencies, failures[0], span


# ----- the webhook ----------------------------------------------------------------------------


@dataclass
class WebhookFigure:
    rate: float
    with_p50: float
    with_p99: float
    without_p50: float
    without_p99: float
    errors: int
    achieved: float


def register_webhook(client: KubeClient, port: int, ca: Path, namespaces: Sequence[str]) -> None:
    config = helm.webhook_configuration(
        wh.CONFIG_NAME,
        registration.client_config_url(
            f"https://127.0.0.1:{port}/validate", ca_bundle_pem=ca.read_bytes()
        ),
        namespaces=namespaces,
        class_selector={"matchLabels": {"dra-gpu.bench/webhook": "true"}},
    )
    client.request("POST", wh.WEBHOOKS, body=config)
    waiting.wait_for("the webhook in effect", lambda: wh.webhook_in_effect(client), timeout=30)


def webhook_figures(
    client: KubeClient, port: int, ca: Path, rates: Sequence[float], namespaces: Sequence[str]
) -> list[WebhookFigure]:
    def create(i: int) -> None:
        client.call("POST", wh.CLAIMS, query={"dryRun": "All"}, body=wh.claim(i))

    # Every rate with the webhook, then every rate without it: one registration and one
    # removal to wait for, not one per rate.
    register_webhook(client, port, ca, namespaces)
    with_hook = [_paced_creates(create, rate) for rate in rates]
    wh.unregister(client)
    without = [_paced_creates(create, rate) for rate in rates]
    out = []
    for rate, (hooked, errs_with, span), (alone, errs_without, _) in zip(
        rates, with_hook, without, strict=True
    ):
        out.append(
            WebhookFigure(
                rate=rate,
                with_p50=sl.percentile(hooked, 0.5),
                with_p99=sl.percentile(hooked, 0.99),
                without_p50=sl.percentile(alone, 0.5),
                without_p99=sl.percentile(alone, 0.99),
                errors=errs_with + errs_without,
                achieved=sl.rate(len(hooked) - 1, span),
            )
        )
        log(f"webhook at {rate}/s: {out[-1]}")
    return out


def _paced_creates(create: Callable[[int], None], rate: float) -> tuple[list[float], int, float]:
    paced(wh.WARMUP, rate, create)
    return paced(max(WEBHOOK_MIN_CREATES, int(rate * WEBHOOK_SECONDS)), rate, create)


# ----- the machine ----------------------------------------------------------------------------


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


class MemoryGuard:
    """Stops the running publishers when the machine's available memory falls below a floor:
    the API server and etcd grow with the slices, and the machine is shared."""

    def __init__(self, floor_gib: float) -> None:
        self.floor_gib = floor_gib
        self.tripped: str | None = None
        self._workers: Workers | None = None
        self._lock = threading.Lock()  # guards _workers: set by the run, read by the guard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="memory guard")
        self._thread.start()

    def watch(self, workers: Workers | None) -> None:
        with self._lock:
            self._workers = workers

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            free = mem_available_gib()
            if free >= self.floor_gib:
                continue
            with self._lock:
                workers = self._workers
            if workers is not None and self.tripped is None:
                self.tripped = f"MemAvailable {free:.1f} GiB < {self.floor_gib:g} GiB"
                log(f"memory guard: {self.tripped}; stopping the publishers")
                workers.kill()

    def close(self) -> None:
        self._stop.set()


# ----- publishers -----------------------------------------------------------------------------


class Workers:
    """The publisher processes of one layout, nodes dealt out round-robin.

    Made, they start in the background (imports, one client per node); ``go`` first waits for
    them to be ready. So the next layout's workers get ready while this one's clean-up runs."""

    def __init__(
        self,
        kubeconfig: Path,
        layout: sl.Layout,
        nodes: Sequence[str],
        count: int,
        logdir: Path,
        *,
        sync_timeout_s: float,
    ) -> None:
        self._procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[bytes]] = []
        for w in range(count):
            mine = nodes[w::count]
            argv = [
                sys.executable,
                str(ROOT / "bench" / "scale_publishers.py"),
                f"--kubeconfig={kubeconfig}",
                f"--layout={layout.name}",
                f"--sync-timeout-s={sync_timeout_s}",
                *(f"--node={n}" for n in mine),
            ]
            err = open(logdir / f"publishers-{layout.name}-{w}.log", "ab")  # noqa: SIM115
            self._logs.append(err)
            self._procs.append(
                subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
                )
            )
        self._ready = False

    def _wait_ready(self) -> None:
        if not self._ready:
            for proc in self._procs:
                self._read(proc, "ready")
            self._ready = True

    def _read(self, proc: subprocess.Popen[str], key: str) -> Any:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a publisher worker exited (rc {proc.wait()}); see its log")
        answer = json.loads(line)
        if key not in answer:
            raise RuntimeError(f"publisher worker: {answer}")
        return answer[key]

    def _send(self, command: str) -> None:
        for proc in self._procs:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()

    def go(self) -> tuple[float, list[float]]:
        """Start every publisher; (unix time of the start, time each node was published)."""
        self._wait_ready()
        start = time.time()
        self._send("go")
        synced: list[float] = []
        for proc in self._procs:
            synced += self._read(proc, "synced")
        return start, synced

    def counts(self) -> dict[str, int]:
        self._send("counts")
        total: dict[str, int] = {}
        for proc in self._procs:
            for call, n in self._read(proc, "counts").items():
                total[call] = total.get(call, 0) + int(n)
        return total

    def restart(self) -> None:
        """New publishers in place of the running ones (a restart of every node's plugin;
        the processes stay, which is the benchmark's own); ``go`` starts them."""
        self._send("restart")
        self._ready = False
        self._wait_ready()

    def kill(self) -> None:
        """End the workers at once (their reads then fail); ``stop`` still reaps them."""
        for proc in self._procs:
            proc.kill()

    def stop(self) -> None:
        for proc in self._procs:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for err in self._logs:
            err.close()


# ----- the workload ---------------------------------------------------------------------------


class Tracker:
    """Watches one namespace's objects of a kind; records when ``done(obj)`` first holds for
    each, keyed by ``key(obj)`` (a daemon thread; stops on ``stop`` at its next event)."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        key: Callable[[JSON], str | None],
        done: Callable[[JSON], bool],
    ) -> None:
        self.when: dict[str, float] = {}
        self._client = client
        self._path = path
        self._key = key
        self._done = done
        self.stop = threading.Event()
        listed = client.request("GET", path, timeout_s=120)
        self._rv = str((listed.get("metadata") or {}).get("resourceVersion", ""))
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"track {path}")
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                query = {"resourceVersion": self._rv, "allowWatchBookmarks": "true"}
                for event in self._client.watch(self._path, query=query, stop=self.stop):
                    now = time.time()
                    obj = event.get("object") or {}
                    self._rv = str((obj.get("metadata") or {}).get("resourceVersion", self._rv))
                    if event.get("type") not in ("ADDED", "MODIFIED"):
                        continue
                    name = self._key(obj)
                    if name is not None and name not in self.when and self._done(obj):
                        self.when[name] = now
            except errors.Gone:
                log(f"watch of {self._path} expired; events in between are lost")
                self._rv = ""
            except errors.ApiError as err:
                log(f"watch of {self._path}: {err}")
                self.stop.wait(1.0)


def pod_of_claim(claim: JSON) -> str | None:
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            return str(ref.get("name"))
    return None


@dataclass
class Workload:
    pods: int
    bound: int
    seconds: float
    pods_per_s: float
    alloc_p50_ms: float
    alloc_p99_ms: float
    claim_p50_ms: float  # pod created -> its claim created (the controller-manager's part)
    bound_p50_ms: float
    bound_p99_ms: float
    create_errors: int


def run_workload(client: KubeClient, run: sl.Run, pods: int, rate: float) -> Workload:
    layout, ns = run.layout, run.namespace
    base = f"/api/v1/namespaces/{ns}"
    client.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
        body=sl.claim_template(layout, name=TEMPLATE, namespace=ns),
    )
    bound = Tracker(
        client,
        f"{base}/pods",
        key=lambda o: str(o["metadata"]["name"]),
        done=lambda o: bool((o.get("spec") or {}).get("nodeName")),
    )
    claims = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    allocated = Tracker(
        client,
        claims,
        key=pod_of_claim,
        done=lambda o: bool((o.get("status") or {}).get("allocation")),
    )
    claimed = Tracker(client, claims, key=pod_of_claim, done=lambda o: True)
    created: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"p-{i:06d}"
        created[name] = time.time()
        client.request("POST", f"{base}/pods", body=sl.pod(name, namespace=ns, template=TEMPLATE))

    _, create_errors, _ = paced(pods, rate, create)
    wanted = pods - create_errors
    deadline = time.monotonic() + max(180.0, 4.0 * pods / rate)
    while len(bound.when) < wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    # A claim is allocated before its pod is bound, but its watch event may come after.
    settle = time.monotonic() + 2.0
    while len(allocated.when) < len(bound.when) and time.monotonic() < settle:
        time.sleep(0.1)
    for tracker in (bound, allocated, claimed):
        tracker.stop.set()
    done = [bound.when[p] for p in created if p in bound.when]
    seconds = (max(done) - min(created.values())) if done else float("nan")
    to_alloc = [(allocated.when[p] - created[p]) * 1e3 for p in created if p in allocated.when]
    to_bind = [(bound.when[p] - created[p]) * 1e3 for p in created if p in bound.when]
    to_claim = [(claimed.when[p] - created[p]) * 1e3 for p in created if p in claimed.when]
    return Workload(
        pods=pods,
        bound=len(done),
        seconds=seconds,
        pods_per_s=sl.rate(len(done), seconds),
        alloc_p50_ms=sl.percentile(to_alloc, 0.5),
        alloc_p99_ms=sl.percentile(to_alloc, 0.99),
        claim_p50_ms=sl.percentile(to_claim, 0.5),
        bound_p50_ms=sl.percentile(to_bind, 0.5),
        bound_p99_ms=sl.percentile(to_bind, 0.99),
        create_errors=create_errors,
    )


def _delete_all(client: KubeClient, path: str, what: str, query: Mapping[str, str]) -> None:
    """A collection delete, sent again while anything is left: the API server ends one that
    takes longer than its request timeout (a thousand pods on a loaded machine) part-way."""

    def gone() -> bool:
        try:
            client.request("DELETE", path, query=query, timeout_s=600)
        except errors.ApiUnavailable as err:
            log(f"deleting {what}: {err}; again")
        return not client.request("GET", path, query={"limit": "1"}).get("items")

    waiting.wait_for(f"{what} to be gone", gone, timeout=600, every=0.5)


def clean_up(client: KubeClient, run: sl.Run) -> float:
    """Delete the layout's pods and claims, and all slices; seconds it took.

    Collection deletes through the API (not kubectl, whose 120 s limit a loaded API server with
    a thousand pods exceeded, ending the whole run). The slices and the workload go in parallel:
    neither waits for the other (the claims' deallocation needs no slice), and the slices of a
    large layout take as long to delete as the claims."""
    ns = run.namespace
    start = time.monotonic()

    def workload() -> None:
        force = {"gracePeriodSeconds": "0"}
        _delete_all(client, f"/api/v1/namespaces/{ns}/pods", "the workload's pods", force)
        claims = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
        _delete_all(client, claims, "the workload's claims", {})

    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(workload), pool.submit(_delete_all, client, SLICES, "the slices", {})]
        for future in done:
            future.result()
    return time.monotonic() - start


def explain_seconds(kubeconfig: Path, run: sl.Run, workdir: Path) -> float:
    path = workdir / f"template-{run.namespace}.yaml"
    body = sl.claim_template(run.layout, name=TEMPLATE, namespace=run.namespace)
    path.write_text(json.dumps(body))
    argv = [sys.executable, "-m", "dra_gpu", "explain", "-f", str(path)]
    argv += ["-n", run.namespace, "--kubeconfig", str(kubeconfig)]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        log(f"dra-gpu explain exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return float("nan")
    return seconds


# ----- one layout -----------------------------------------------------------------------------


@dataclass
class Figures:
    run: sl.Run
    devices_per_node: int = 0
    slices_per_node: int = 0
    kib_per_node: float = 0.0
    # None: not measured (the layout stopped before it); a figure is never a default zero.
    publish_s: float | None = None
    republish_s: float | None = None
    rewrites: int | None = None
    cold_calls: dict[str, float] | None = None  # per node
    before: Memory | None = None
    after: Memory | None = None
    steady_all: dict[tuple[str, ...], float] = field(default_factory=dict)
    steady_ours: dict[str, float] = field(default_factory=dict)
    watches: float = 0.0
    watches_slices: float = 0.0
    workload: Workload | None = None
    workload_calls: dict[str, float] = field(default_factory=dict)  # the binders', per pod
    explain_s: float | None = None
    load: tuple[float, float, float] | None = None
    stopped: str | None = None

    @property
    def layout(self) -> sl.Layout:
        return self.run.layout


def watch_count(samples: Mapping[str, Sequence[sl.Sample]], resource: str | None) -> float:
    return sum(
        v
        for labels, v in samples.get("apiserver_longrunning_requests", [])
        if labels.get("verb") == "WATCH" and resource in (None, labels.get("resource"))
    )


def steady_state(
    fig: Figures, cluster: Cluster, workers: Workers, *, seconds: float, nodes: int
) -> None:
    log(f"{fig.layout.name}: steady state for {seconds:.0f} s")
    m0, c0, t0 = apiserver_metrics(cluster), workers.counts(), time.monotonic()
    time.sleep(seconds)
    m1, c1, t1 = apiserver_metrics(cluster), workers.counts(), time.monotonic()
    keys = ("verb", "resource")
    window = sl.deltas(
        sl.counter_by(m0, "apiserver_request_total", keys),
        sl.counter_by(m1, "apiserver_request_total", keys),
    )
    fig.steady_all = sl.per_node_minute(window, nodes=nodes, seconds=t1 - t0)
    ours: dict[tuple[str, ...], float] = {(k,): v - c0.get(k, 0) for k, v in c1.items()}
    per = sl.per_node_minute(ours, nodes=nodes, seconds=t1 - t0)
    fig.steady_ours = {k[0]: v for k, v in per.items()}
    fig.watches = watch_count(m1, None)
    fig.watches_slices = watch_count(m1, "resourceslices")


def run_layout(
    cluster: Cluster,
    client: KubeClient,
    run: sl.Run,
    *,
    steady: bool,
    nodes: Sequence[str],
    args: argparse.Namespace,
    pids: Mapping[str, int],
    workdir: Path,
    guard: MemoryGuard,
    workers: Workers,
    spawn_next: Callable[[], Workers | None],
) -> tuple[Figures, Workers | None]:
    """The run's figures, measured with ``workers`` (its layout's publishers, not started yet);
    a run the guard stopped (or a worker that died) keeps those it has, and the reason. The
    next run's workers (``spawn_next``) are started before the clean-up and returned."""
    fig = Figures(run)
    try:
        _measure(
            fig,
            cluster,
            client,
            steady=steady,
            nodes=nodes,
            args=args,
            pids=pids,
            workers=workers,
            workdir=workdir,
            guard=guard,
        )
    except (RuntimeError, waiting.WaitTimeout) as err:
        fig.stopped = guard.tripped or str(err)
        log(f"{run.label}: stopped: {fig.stopped}")
    finally:
        guard.watch(None)
        workers.stop()
    log("before clean-up:\n" + "\n".join(table([fig], len(nodes))))  # kept if clean-up fails
    following = spawn_next()
    if following is not None:  # after the last layout the cluster goes as a whole
        log(f"{run.label}: cleaned up in {clean_up(client, run):.1f} s")
    return fig, following


def _measure(
    fig: Figures,
    cluster: Cluster,
    client: KubeClient,
    *,
    steady: bool,
    nodes: Sequence[str],
    args: argparse.Namespace,
    pids: Mapping[str, int],
    workers: Workers,
    workdir: Path,
    guard: MemoryGuard,
) -> None:
    layout = fig.layout
    sample = layout.render(nodes[0], "00000000-0000-0000-0000-000000000000")
    fig.slices_per_node = len(sample)
    fig.devices_per_node = sum(len(s["spec"].get("devices") or []) for s in sample)
    fig.kib_per_node = len(json.dumps(sample)) / 1024
    client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": fig.run.namespace}})
    fig.before = memory(cluster, pids)
    log(f"{fig.run.label}: starting the {len(nodes)} publishers of {args.workers} workers")
    guard.watch(workers)
    start, synced = workers.go()
    fig.publish_s = max(synced) - start
    log(f"{fig.run.label}: all slices published in {fig.publish_s:.1f} s")
    fig.cold_calls = {k: v / len(nodes) for k, v in workers.counts().items()}
    time.sleep(2.0)
    fig.after = memory(cluster, pids)
    if steady:
        steady_state(fig, cluster, workers, seconds=args.steady_s, nodes=len(nodes))
    log(f"{fig.run.label}: restarting the publishers over their slices")
    workers.restart()
    start, synced = workers.go()
    fig.republish_s = max(synced) - start
    log(f"{fig.run.label}: restarted publishers in sync in {fig.republish_s:.1f} s")
    counts = workers.counts()
    fig.rewrites = sum(counts.get(k, 0) for k in ("POST resourceslices", "PUT resourceslices"))
    log(f"{fig.run.label}: workload of {args.pods} pods at {args.rate}/s")
    before = workers.counts()
    fig.workload = run_workload(client, fig.run, args.pods, args.rate)
    log(f"{fig.run.label}: {fig.workload}")
    binders = {
        k: (v - before.get(k, 0)) / max(1, args.pods)
        for k, v in workers.counts().items()
        if k.split(" ")[-1].startswith(("pods", "resourceclaims"))
    }
    fig.workload_calls = {k: v for k, v in binders.items() if v}
    fig.explain_s = explain_seconds(cluster.kubeconfig, fig.run, workdir)
    log(f"{fig.run.label}: dra-gpu explain took {fig.explain_s:.1f} s")
    fig.load = os.getloadavg()


# ----- output ---------------------------------------------------------------------------------


def _f(value: float, digits: int = 1) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


Cell = Callable[["Figures"], str | None]  # None: the figure was not measured


def _opt(value: float | None, digits: int = 1) -> str | None:
    return None if value is None else _f(value, digits)


def _cold(f: Figures) -> str | None:
    if f.cold_calls is None:
        return None
    return ", ".join(f"{call} {n:.1f}" for call, n in sorted(f.cold_calls.items()))


def _sum(values: Mapping[Any, float]) -> str | None:
    return _f(sum(values.values()), 2) if values else None


def _ours(call: str) -> Cell:
    return lambda f: _f(f.steady_ours.get(call, 0.0), 2) if f.steady_ours else None


def _all(key: tuple[str, ...]) -> Cell:
    return lambda f: _f(f.steady_all.get(key, 0.0), 2) if f.steady_all else None


def not_measured(f: Figures) -> str:
    """What a figure the run has no value for prints: why, for a layout that stopped; ``-`` for
    one that finished (a figure not asked for: the steady state of a layout after the first)."""
    if f.stopped:
        return f"not measured: {f.stopped.strip().splitlines()[0]}"
    return "-"


def exit_status(figs: Sequence[Figures], *, allow_partial: bool) -> int:
    """1 when a layout stopped (its figures are partial), unless ``--allow-partial``."""
    return 1 if any(f.stopped for f in figs) and not allow_partial else 0


def table(figs: Sequence[Figures], nodes: int) -> list[str]:
    rows: list[tuple[str, Cell]] = [
        ("devices / slices per node", lambda f: f"{f.devices_per_node} / {f.slices_per_node}"),
        ("slice JSON per node (KiB)", lambda f: _f(f.kib_per_node)),
        ("publish all, cold start (s)", lambda f: _opt(f.publish_s)),
        ("publish all, restart (s)", lambda f: _opt(f.republish_s)),
        ("slices rewritten on restart", lambda f: None if f.rewrites is None else str(f.rewrites)),
        ("cold start: our calls per node", _cold),
    ]

    def mem(attr: str) -> Cell:
        def cell(f: Figures) -> str | None:
            if f.before is None or f.after is None:
                return None
            return _f(getattr(f.after, attr) - getattr(f.before, attr))

        return cell

    rows += [
        ("API server RSS growth (MiB)", mem("apiserver_mib")),
        ("etcd RSS growth (MiB)", mem("etcd_mib")),
        ("etcd: slices stored (MiB)", mem("slice_mib")),
        ("etcd: db in use growth (MiB)", mem("etcd_in_use_mib")),
    ]

    def wl(attr: str, digits: int = 1) -> Cell:
        return lambda f: _f(getattr(f.workload, attr), digits) if f.workload else None

    rows += [
        (
            "pods bound / created",
            lambda f: f"{f.workload.bound} / {f.workload.pods}" if f.workload else None,
        ),
        ("pods/s (creation -> bound)", wl("pods_per_s")),
        ("pod created -> its claim created p50 (ms)", wl("claim_p50_ms", 0)),
        ("pod created -> allocated p50 (ms)", wl("alloc_p50_ms", 0)),
        ("pod created -> allocated p99 (ms)", wl("alloc_p99_ms", 0)),
        ("pod created -> bound p99 (ms)", wl("bound_p99_ms", 0)),
        ("dra-gpu explain, whole cluster (s)", lambda f: _opt(f.explain_s)),
        (
            "workload: binders' calls per pod",
            lambda f: ", ".join(f"{k} {v:.1f}" for k, v in sorted(f.workload_calls.items())) or "-",
        ),
        ("steady: all requests /node/min", lambda f: _sum(f.steady_all)),
        ("steady: our publishers' /node/min", lambda f: _sum(f.steady_ours)),
    ]
    calls = sorted({k for f in figs for k in f.steady_ours})
    rows += [(f"  ours: {c}", _ours(c)) for c in calls]
    totals: dict[tuple[str, ...], float] = {}
    for f in figs:
        for k, v in f.steady_all.items():
            totals[k] = totals.get(k, 0.0) + v
    top = sorted(totals, key=lambda k: -totals[k])[:8]
    rows += [(f"  all: {k[0]} {k[1]}", _all(k)) for k in top]
    rows += [
        (
            "open watches: all / resourceslices",
            lambda f: f"{f.watches:.0f} / {f.watches_slices:.0f}" if f.steady_all else None,
        ),
        ("load average at the end (1 min)", lambda f: _opt(f.load[0] if f.load else None, 2)),
        ("stopped", lambda f: f.stopped or "no"),
    ]

    def shown(f: Figures, cell: Cell) -> str:
        value = cell(f)
        return not_measured(f) if value is None else value

    head = f"| {nodes} nodes | " + " | ".join(f"`{f.run.label}`" for f in figs) + " |"
    lines = [head, "|" + "---|" * (len(figs) + 1)]
    lines += ["| layout | " + " | ".join(f.layout.summary for f in figs) + " |"]
    lines += [f"| {label} | " + " | ".join(shown(f, c) for f in figs) + " |" for label, c in rows]
    return lines


def closing_lines(figs: Sequence[Figures], layouts: Sequence[sl.Layout]) -> list[str]:
    """A line per layout, ``LAYOUT: N pods in S s, R pods/s``; with several rounds, the median
    round's, with every round's pods/s after it, and before them each layout against
    ``minimal``: the ratio of the medians, then the ratio in each round."""
    picked: dict[str, Figures] = {}
    each: dict[str, list[float]] = {}
    by_round: dict[str, dict[int, float]] = {}
    for layout in layouts:
        mine = [f for f in figs if f.layout.name == layout.name]
        if not mine:
            continue
        values = {f.run.round: f.workload.pods_per_s if f.workload else math.nan for f in mine}
        by_round[layout.name] = values
        each[layout.name] = [values[r] for r in sorted(values)]
        try:
            pick = sl.median_run(values)
        except ValueError:  # no round has a workload: show the first one's reason
            pick = mine[0].run.round
        picked[layout.name] = next(f for f in mine if f.run.round == pick)
    several = any(len(v) > 1 for v in each.values())
    lines: list[str] = []
    control = picked.get("minimal")
    if several and control is not None and control.workload is not None:
        for name, f in picked.items():
            if name != "minimal" and f.workload is not None:
                ratio = f.workload.pods_per_s / control.workload.pods_per_s
                lines.append(f"{name} / minimal: {ratio:.2f} (pods/s, medians)")
                rounds = sl.round_ratios(by_round[name], by_round["minimal"])
                lines.append(
                    f"{name} / minimal by round: {', '.join(_f(v, 2) for v in rounds.values())}"
                )
    for name, f in picked.items():
        w = f.workload
        if w is None:
            lines.append(f"{name}: {not_measured(f)}")
            continue
        line = f"{name}: {w.bound} pods in {w.seconds:.1f} s, {w.pods_per_s:.1f} pods/s"
        if several:
            line += f" (median of rounds: {', '.join(_f(v) for v in each[name])})"
        lines.append(line)
    return lines


def webhook_table(figs: Sequence[WebhookFigure]) -> list[str]:
    lines = [
        "| claim creates/s (achieved) | with webhook p50 / p99 (ms) | without p50 / p99 (ms) "
        "| added p50 / p99 (ms) | errors |",
        "|---|---|---|---|---|",
    ]
    for f in figs:
        lines.append(
            f"| {f.rate:.0f} ({_f(f.achieved, 0)}) | {_f(f.with_p50)} / {_f(f.with_p99)} "
            f"| {_f(f.without_p50)} / {_f(f.without_p99)} "
            f"| {_f(f.with_p50 - f.without_p50)} / {_f(f.with_p99 - f.without_p99)} | {f.errors} |"
        )
    return lines


# ----- main -----------------------------------------------------------------------------------


@contextlib.contextmanager
def kwok_running(cluster: Cluster, workdir: Path) -> Iterator[None]:
    binary = kwok.ensure_kwok()
    config = kwok.write_config(workdir / "kwok.yaml")
    argv = kwok.kwok_argv(binary, cluster.kubeconfig, config)
    proc = procs.spawn(argv, log_path=workdir / "kwok.log")
    try:
        yield
    finally:
        procs.stop(proc)


def classes_present(client: KubeClient) -> bool:
    names = {str(c["metadata"]["name"]) for c in client.request("GET", CLASSES).get("items") or []}
    return {GPU_CLASS, MIG_CLASS} <= names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--layouts", default="static,minimal,mig,dynamic-mig,consumable")
    parser.add_argument("--pods", type=int, help="pods per layout (default: one per node)")
    parser.add_argument("--rate", type=float, default=50.0, help="pod creations per second")
    parser.add_argument("--steady-s", type=float, default=60.0)
    parser.add_argument(
        "--steady-every",
        action="store_true",
        help="measure the steady state on every layout (default: the first only)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of all layouts, every other one in reverse order; each layout's final "
        "line is then its median round",
    )
    parser.add_argument("--workers", type=int, default=2, help="publisher processes")
    parser.add_argument("--webhook-rates", default="50,200")
    parser.add_argument(
        "--publish-timeout-s",
        type=float,
        default=600.0,
        help="a layout whose publishers are not all in sync after this long is stopped",
    )
    parser.add_argument(
        "--min-free-gib",
        type=float,
        default=3.0,
        help="stop a layout's publishers when the machine's available memory falls below this",
    )
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="exit 0 even when a layout stopped (its figures print `not measured: <why>`)",
    )
    parser.add_argument(
        "--scheduler",
        choices=("stock", "patched"),
        default="stock",
        help="patched: kube-scheduler with docs/upstream/dra-cel-lazy-attributes.patch",
    )
    args = parser.parse_args(argv)
    layouts = sl.parse_layouts(args.layouts)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    runs = sl.schedule(layouts, args.repeat)
    args.pods = args.pods or args.nodes
    for layout in layouts:
        if args.pods > layout.per_node * args.nodes:
            parser.error(f"{args.pods} pods do not fit {layout.name}'s devices")
    rates = [float(r) for r in args.webhook_rates.split(",") if r]
    nodes = [f"{NODE_PREFIX}{i:05d}" for i in range(args.nodes)]
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="dra-gpu-scale-"))
    extra = {CONTROLLER_MANAGER: CLIENT_LIMITS, SCHEDULER: CLIENT_LIMITS}
    figs: list[Figures] = []
    overrides: dict[str, Path] = {}
    if args.scheduler == "patched":
        overrides[SCHEDULER] = dra_patch.patched_scheduler(binaries.Versions.from_env(), log=log)
    with (
        Cluster(extra_args=extra, log=log, binary_overrides=overrides) as cluster,
        kwok_running(cluster, workdir),
        wh.controller(str(cluster.kubeconfig), workdir) as (port, ca),
    ):
        client = connect(cluster.kubeconfig)
        pids = {b: component_pid(cluster, b) for b in ("kube-apiserver", "etcd")}
        log(f"cluster up in {time.monotonic() - began:.0f} s; creating {args.nodes} nodes")
        waiting.wait_for(
            "the controller's DeviceClasses", lambda: classes_present(client), timeout=60
        )
        create_nodes(client, nodes)
        log(f"{args.nodes} nodes Ready at {time.monotonic() - began:.0f} s")
        wh.ensure_namespace(client)
        namespaces = [wh.NS, *(run.namespace for run in runs)]
        hooks = webhook_figures(client, port, ca, rates, namespaces)
        register_webhook(client, port, ca, namespaces)  # the workload's claims pass it too
        guard = MemoryGuard(args.min_free_gib)

        def spawn(i: int) -> Workers | None:
            if i >= len(runs):
                return None
            return Workers(
                cluster.kubeconfig,
                runs[i].layout,
                nodes,
                args.workers,
                workdir,
                sync_timeout_s=args.publish_timeout_s,
            )

        workers = spawn(0)
        for i, run in enumerate(runs):
            assert workers is not None
            fig, workers = run_layout(
                cluster,
                client,
                run,
                steady=args.steady_every or i == 0,
                nodes=nodes,
                args=args,
                pids=pids,
                workdir=workdir,
                guard=guard,
                workers=workers,
                spawn_next=functools.partial(spawn, i + 1),
            )
            figs.append(fig)
            log("so far:\n" + "\n".join(table(figs, args.nodes)))  # kept if a later layout fails
        guard.close()
        client.close()
    total = time.monotonic() - began
    print(
        f"\n{args.nodes} nodes, {args.pods} pods per layout at {args.rate:.0f}/s, "
        f"steady window {args.steady_s:.0f} s, {args.workers} publisher workers, "
        f"{args.repeat} round(s); {args.scheduler} kube-scheduler; "
        f"{os.cpu_count()} CPUs; run took {total:.0f} s\n"
    )
    print("\n".join(table(figs, args.nodes)))
    print()
    print("\n".join(webhook_table(hooks)))
    print()
    print("\n".join(closing_lines(figs, layouts)))
    if not args.keep_workdir:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs in {workdir}", file=sys.stderr)
    stopped = [f.run.label for f in figs if f.stopped]
    if stopped:
        print(f"stopped, figures partial: {', '.join(stopped)}", file=sys.stderr)
    return exit_status(figs, allow_partial=args.allow_partial)


if __name__ == "__main__":
    raise SystemExit(main())
