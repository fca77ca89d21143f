"""Our API client (``KubeClient`` on urllib3) against the ``kubernetes`` package's ``ApiClient``
used with raw JSON in and out: CPU per request, wall latency, import time and RSS.

Usage: ``.venv/bin/python bench/kube_client.py [--count 2000] [--blocks 5]
[--auth kubeconfig|in-cluster] [--kubeconfig PATH] [--probes 5]``

Unless ``--kubeconfig`` names a running cluster, starts a local control plane
(``e2e.cluster.Cluster``). Creates one ResourceClaim, allocates it (its status written as the
scheduler would) and gives it a device status, so the GET answers what a prepare reads. The two
calls measured are the kubelet plugin's:

- ``GET`` the claim: every prepare makes one, on the kubelet's call path;
- ``PATCH`` its ``status`` as a server-side apply (``application/apply-patch+yaml``, field
  manager, ``force``): the device-status write after a prepare, the same body every time.

The clients, each in a worker process of its own (so its process CPU time is the client's alone,
and it carries only its own imports, as the plugin would):

1. ``KubeClient``: ``KubeClient.call`` as the plugin makes it (decoded JSON and the server's
   warnings, errors mapped, one retry of a broken GET, fresh credentials after a 401).
2. ``ApiClient``: the ``kubernetes`` package's ``ApiClient`` from its own loader, the way a
   project uses it without the generated models: ``param_serialize`` (headers, auth settings:
   the token refresh hook) and ``call_api`` (its urllib3 pool, TLS), the body given as JSON text
   (the cheapest: no ``sanitize_for_serialization`` walk), the answer read raw and decoded with
   ``json.loads``, a non-2xx raised as ``ApiException``, the warnings parsed as ours are.
3. ``rest_client``: the floor under 2: its ``RESTClientObject.request`` with the auth headers from
   ``Configuration.auth_settings()`` (the refresh hook still runs), the URL built by hand.

``--auth kubeconfig`` (default): all three read the same kubeconfig (the local cluster's admin
one: client certificate over TLS). ``--auth in-cluster``: a ServiceAccount token and the CA in a
temporary service-account directory, read by ``credentials.in_cluster`` and by the package's
``InClusterConfigLoader`` (both re-read the token file once it is a minute old), as in a pod.

Each worker warms up (its TLS connection, the server's caches), then ``--blocks`` blocks; in a
block every worker makes ``--count`` GETs, then every worker ``--count`` PATCHes (``--patches``
to change that), one worker at a time in an order that rotates every block, so all see the same
load on a busy machine. Per request: the worker's CPU time (``time.process_time``: user +
system of the whole process, which does nothing else) and wall time. Printed: CPU ms per request
(median over blocks, and each block's), the median over blocks of each block's ratio to
KubeClient's (the blocks' load differs; within a block it is the same), wall p50 / p99 over all
requests, the 1-minute load average at each block, and each worker's RSS at the end.

Then ``--probes`` fresh interpreters per client (in turn): the time to import the client (wall
and the process's CPU: the CPU figure is the steadier one on a loaded machine), the RSS (VmRSS)
after the import, and after building the client and making one GET; alone, and after the
kubelet plugin's modules (what it has loaded once it serves), i.e. what the plugin would carry
with each client. Medians over the probes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NS = "default"
NAME = "bench-kube-client"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
CLAIM = f"{CLAIMS}/{NAME}"
DRIVER = "gpu.nvidia.com"
POOL = "bench-node"
FIELD_MANAGER = "gpu.nvidia.com/bench"
APPLY_PATCH = "application/apply-patch+yaml"
TIMEOUT = (5.0, 20.0)  # connect, read: KubeClient's CONNECT_TIMEOUT_S and REQUEST_TIMEOUT_S
CLIENTS = ("KubeClient", "ApiClient", "rest_client")
WARMUP_GETS = 300
WARMUP_PATCHES = 50
SERVICE_ACCOUNT = "bench-kube-client"
# What the kubelet plugin has loaded once it serves: bench/api_get.py's list, and the prepare
# side it imports after publishing (pydantic, the checkpoint, device status).
SERVING_MODULES = (
    "grpc",
    "dra_gpu.plugin.main",
    "dra_gpu.plugin.lifecycle",
    "dra_gpu.plugin.node_plugin",
    "dra_gpu.plugin.current_devices",
    "dra_gpu.plugin.health_monitor",
    "dra_gpu.plugin.prepare_core",
    "dra_gpu.kubeletplugin.slice_api",
    "dra_gpu.kubeletplugin.driver",
    "dra_gpu.prepare.claims",
    "dra_gpu.prepare.events",
    "dra_gpu.prepare.state",
    "dra_gpu.prepare.checkpoint",
    "dra_gpu.prepare.device_status",
    "dra_gpu.kube.capabilities",
)


@dataclass(frozen=True)
class Target:
    """Where and as whom the clients connect."""

    auth: str  # "kubeconfig" or "in-cluster"
    kubeconfig: Path
    sa_dir: Path | None  # in-cluster: token and ca.crt
    server: str  # https://host:port

    def argv(self) -> list[str]:
        out = ["--auth", self.auth, "--kubeconfig", str(self.kubeconfig), "--server", self.server]
        return [*out, "--sa-dir", str(self.sa_dir)] if self.sa_dir else out

    def env(self) -> dict[str, str]:
        host, _, port = self.server.removeprefix("https://").rpartition(":")
        return {"KUBERNETES_SERVICE_HOST": host.strip("[]"), "KUBERNETES_SERVICE_PORT": port}


def status_body() -> dict[str, Any]:
    """The device-status apply patch: one entry as the plugin writes it for a GPU."""
    entry = {
        "driver": DRIVER,
        "pool": POOL,
        "device": "gpu-0",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared for the claim's containers",
                "lastTransitionTime": "2026-12-06T00:00:00Z",
            }
        ],
        "data": {
            "type": "gpu",
            "uuid": "GPU-4b3c2d1e-0f9a-8b7c-6d5e-4f3a2b1c0d9e",
            "productName": "NVIDIA H200",
            "driverVersion": "580.95.05",
            "pciBusID": "0000:1b:00.0",
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": NAME, "namespace": NS},
        "status": {"devices": [entry]},
    }


# --- the clients ---------------------------------------------------------------------------

Call = Callable[[], dict[str, Any]]


def import_client(kind: str) -> None:
    """Load what the client needs (timed by the probes)."""
    if kind == "KubeClient":
        import dra_gpu.kube.client  # noqa: F401
    else:
        import kubernetes.client
        import kubernetes.config  # noqa: F401


def build(kind: str, target: Target) -> tuple[Call, Call]:
    """The client's claim GET and status apply, each returning the decoded answer."""
    if kind == "KubeClient":
        return _kube_client(target)
    return _api_client(target, floor=kind == "rest_client")


def _kube_client(target: Target) -> tuple[Call, Call]:
    from dra_gpu.kube import credentials
    from dra_gpu.kube.client import APPLY_PATCH as PATCH_TYPE
    from dra_gpu.kube.client import KubeClient, connect
    from dra_gpu.kube.transport import Transport

    if target.sa_dir is None:
        client = connect(target.kubeconfig)
    else:  # connect(None), with the service-account directory and variables given here
        creds = credentials.in_cluster(target.env(), target.sa_dir)
        client = KubeClient(Transport(creds.host, ssl_context=creds.ssl_context), auth=creds.auth)
    body = status_body()
    query = {"fieldManager": FIELD_MANAGER, "force": "true"}

    def get() -> dict[str, Any]:
        return client.call("GET", CLAIM).body

    def patch() -> dict[str, Any]:
        reply = client.call(
            "PATCH", f"{CLAIM}/status", query=query, body=body, content_type=PATCH_TYPE
        )
        return reply.body

    return get, patch


def _api_client(target: Target, *, floor: bool) -> tuple[Call, Call]:
    from urllib.parse import urlencode

    from kubernetes import client as kclient
    from kubernetes import config as kconfig
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    if target.sa_dir is None:
        api = kconfig.new_client_from_config(config_file=str(target.kubeconfig))
    else:  # load_incluster_config, with the service-account directory and variables given here
        cfg = kclient.Configuration()
        InClusterConfigLoader(
            token_filename=str(target.sa_dir / "token"),
            cert_filename=str(target.sa_dir / "ca.crt"),
            environ=target.env(),
        ).load_and_set(cfg)
        api = kclient.ApiClient(cfg)
    cfg = api.configuration
    rest = api.rest_client
    body = json.dumps(status_body())
    query = [("fieldManager", FIELD_MANAGER), ("force", "true")]

    def answer(resp: Any) -> dict[str, Any]:
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=data.decode(), data=None)
        decoded: dict[str, Any] = json.loads(data)
        warning_texts(resp.headers.getlist("Warning"))
        return decoded

    def call(method: str, path: str, q: Any, data: str | None, ctype: str | None) -> Any:
        headers = {"Accept": "application/json"}
        if ctype:
            headers["Content-Type"] = ctype
        if floor:
            for auth in cfg.auth_settings().values():
                if auth["in"] == "header" and auth["value"]:
                    headers[auth["key"]] = auth["value"]
            url = cfg.host + path + (f"?{urlencode(q)}" if q else "")
            return rest.request(method, url, headers=headers, body=data, _request_timeout=TIMEOUT)
        request = api.param_serialize(
            method,
            path,
            query_params=q,
            header_params=headers,
            body=data,
            auth_settings=["BearerToken"],
        )
        return api.call_api(*request, _request_timeout=TIMEOUT)

    def get() -> dict[str, Any]:
        return answer(call("GET", CLAIM, None, None, None))

    def patch() -> dict[str, Any]:
        return answer(call("PATCH", f"{CLAIM}/status", query, body, APPLY_PATCH))

    return get, patch


# client.parse_warnings, repeated here so that the ApiClient's probes load none of our client's
# modules (it is what a driver on the ApiClient would keep).
_WARNING = re.compile(r'^\s*299\s+\S+\s+"(?P<text>(?:[^"\\]|\\.)*)"')


def warning_texts(headers: list[str]) -> tuple[str, ...]:
    out = []
    for header in headers:
        match = _WARNING.match(header)
        out.append(match["text"].replace('\\"', '"').replace("\\\\", "\\") if match else header)
    return tuple(out)


def vm_rss_mib() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


# --- worker: one client, blocks of requests on demand --------------------------------------


def worker(kind: str, target: Target) -> int:
    """Answer ``GET n`` / ``PATCH n`` / ``RSS`` lines on stdin with one JSON line each."""
    import gc

    get, patch = build(kind, target)
    assert get()["metadata"]["name"] == NAME
    stored = patch()
    for _ in range(WARMUP_GETS):
        get()
    for _ in range(WARMUP_PATCHES):
        patch()
    gc.freeze()  # as the plugin does once it started
    print(json.dumps({"ready": kind, "devices": len(stored["status"].get("devices") or [])}))
    for line in sys.stdin:
        op, _, n = line.strip().partition(" ")
        if op == "RSS":
            print(json.dumps({"rss_mib": vm_rss_mib()}), flush=True)
            continue
        call = get if op == "GET" else patch
        walls = [0.0] * int(n)
        clock = time.perf_counter
        cpu0 = time.process_time()
        for i in range(len(walls)):
            t0 = clock()
            call()
            walls[i] = clock() - t0
        cpu = time.process_time() - cpu0
        print(json.dumps({"cpu_ms": 1000 * cpu / len(walls), "wall_ms": [1000 * w for w in walls]}))
        sys.stdout.flush()
    return 0


class Worker:
    def __init__(self, kind: str, target: Target) -> None:
        self.kind = kind
        argv = [sys.executable, __file__, "--worker", kind, *target.argv()]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()
        )
        self.ready = self._read()

    def ask(self, line: str) -> dict[str, Any]:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.kind} ended (exit {self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Byte-compiled modules, as in the image (the package's are; ours are written on first use).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


# --- probe: a fresh interpreter ------------------------------------------------------------


def probe(kind: str, target: Target, serving: bool) -> int:
    """Print the probe's JSON: RSS at start, import seconds, RSS after import, after a GET."""
    import importlib

    out: dict[str, float] = {"start_mib": vm_rss_mib()}
    if serving:
        for name in SERVING_MODULES:
            importlib.import_module(name)
        out["serving_mib"] = vm_rss_mib()
    t0, cpu0 = time.perf_counter(), time.process_time()
    import_client(kind)
    out["import_s"] = time.perf_counter() - t0
    out["import_cpu_s"] = time.process_time() - cpu0
    out["import_mib"] = vm_rss_mib()
    get, _ = build(kind, target)
    get()
    out["get_mib"] = vm_rss_mib()
    print(json.dumps(out))
    return 0


def run_probe(kind: str, target: Target, serving: bool) -> dict[str, float]:
    argv = [sys.executable, __file__, "--probe", kind, *target.argv()]
    if serving:
        argv.append("--serving")
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=_env())
    out: dict[str, float] = json.loads(done.stdout)
    return out


# --- set-up and the run --------------------------------------------------------------------


def prepare_claim(kubeconfig: Path) -> None:
    """The claim, allocated to one device (the workers' first apply gives it its device status)."""
    from dra_gpu.kube import errors
    from dra_gpu.kube.client import connect

    client = connect(kubeconfig)
    with contextlib.suppress(errors.NotFound):
        client.request("DELETE", CLAIM)
        while True:  # gone before it is made again
            client.request("GET", CLAIM)
            time.sleep(0.2)
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"devices": {"requests": [request]}},
    }
    created = client.request("POST", CLAIMS, body=claim)
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [POOL]}]}
        ]
    }
    result = {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": "gpu-0"}
    created["status"] = {"allocation": {"devices": {"results": [result]}, "nodeSelector": selector}}
    client.request("PUT", f"{CLAIM}/status", body=created)
    client.close()


def service_account_dir(kubeconfig: Path, server: str, tmp: Path) -> Path:
    """A service-account directory (token, ca.crt) for an account bound to cluster-admin."""
    import base64

    import yaml

    from dra_gpu.kube import errors
    from dra_gpu.kube.client import connect

    client = connect(kubeconfig)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": SERVICE_ACCOUNT},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NS}],
    }
    with contextlib.suppress(errors.AlreadyExists):
        client.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", body=sa)
    with contextlib.suppress(errors.AlreadyExists):
        client.request(
            "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body=binding
        )
    token = client.request(
        "POST",
        f"/api/v1/namespaces/{NS}/serviceaccounts/{SERVICE_ACCOUNT}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        },
    )["status"]["token"]
    client.close()
    doc = yaml.safe_load(kubeconfig.read_text())
    cluster = next(c["cluster"] for c in doc["clusters"])
    sa_dir = tmp / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(token)
    (sa_dir / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    return sa_dir


@contextlib.contextmanager
def control_plane(kubeconfig: str | None) -> Iterator[Path]:
    if kubeconfig:
        yield Path(kubeconfig)
        return
    from e2e.cluster import Cluster

    with Cluster() as cluster:
        yield cluster.kubeconfig


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(target: Target, count: int, patches: int, blocks: int) -> None:
    workers = [Worker(kind, target) for kind in CLIENTS]
    try:
        for w in workers:
            print(f"  {w.kind}: ready (device status entries in the claim: {w.ready['devices']})")
        cpu: dict[tuple[str, str], list[float]] = {}
        wall: dict[tuple[str, str], list[float]] = {}
        loads = []
        for block in range(blocks):
            loads.append(os.getloadavg()[0])
            order = workers[block % len(workers) :] + workers[: block % len(workers)]
            for op, n in (("GET", count), ("PATCH", patches)):
                for w in order:
                    got = w.ask(f"{op} {n}")
                    cpu.setdefault((op, w.kind), []).append(got["cpu_ms"])
                    wall.setdefault((op, w.kind), []).extend(got["wall_ms"])
            print(f"  block {block + 1}/{blocks} done, load average {loads[-1]:.2f}", flush=True)
        rss = {w.kind: w.ask("RSS")["rss_mib"] for w in workers}
    finally:
        for w in workers:
            w.close()
    print()
    print(
        f"{blocks} blocks x {count} GETs and {patches} apply PATCHes per client, "
        f"1-min load average per block: {', '.join(f'{x:.2f}' for x in loads)}"
    )
    print(
        "| call | client | CPU ms/request (median of blocks) | per block | "
        "wall p50 / p99 ms | CPU / KubeClient's (median of the blocks' ratios) |"
    )
    print("|---|---|---|---|---|---|")
    for op in ("GET", "PATCH"):
        base = cpu[(op, "KubeClient")]
        for kind in CLIENTS:
            c = statistics.median(cpu[(op, kind)])
            walls = wall[(op, kind)]
            spread = " ".join(f"{x:.3f}" for x in cpu[(op, kind)])
            ratio = statistics.median(x / b for x, b in zip(cpu[(op, kind)], base, strict=True))
            print(
                f"| {op} | {kind} | {c:.3f} | {spread} | "
                f"{pct(walls, 0.5):.2f} / {pct(walls, 0.99):.2f} | {ratio:.2f} |"
            )
    print(
        "worker RSS after the run (MiB): "
        + ", ".join(f"{kind} {rss[kind]:.1f}" for kind in CLIENTS)
    )


def probes(target: Target, runs: int) -> None:
    kinds = ("KubeClient", "ApiClient")
    rows: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for serving in (False, True):
        for kind in kinds:  # a first run of each writes the byte code and warms the page cache
            run_probe(kind, target, serving)
    for _ in range(runs):
        for serving in (False, True):
            for kind in kinds:
                rows.setdefault((kind, serving), []).append(run_probe(kind, target, serving))
    print()
    print(f"fresh interpreter, median of {runs}: import time of the client, RSS (MiB)")
    print(
        "| modules | client | import ms wall / CPU | RSS before | after import "
        "| after build + one GET |"
    )
    print("|---|---|---|---|---|---|")
    for serving in (False, True):
        for kind in kinds:
            got = rows[(kind, serving)]

            def med(key: str, got: list[dict[str, float]] = got) -> float:
                return statistics.median(r[key] for r in got)

            before = med("serving_mib") if serving else med("start_mib")
            label = "plugin's serving modules +" if serving else "interpreter +"
            print(
                f"| {label} | {kind} | {1000 * med('import_s'):.0f} / "
                f"{1000 * med('import_cpu_s'):.0f} | {before:.1f} | "
                f"{med('import_mib'):.1f} | {med('get_mib'):.1f} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="GETs per client and block")
    parser.add_argument("--patches", type=int, help="PATCHes per client and block (--count)")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--probes", type=int, default=5, help="fresh interpreters per client")
    parser.add_argument("--auth", choices=("kubeconfig", "in-cluster"), default="kubeconfig")
    parser.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    parser.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--probe", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--serving", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--sa-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or args.probe:
        target = Target(args.auth, Path(args.kubeconfig), args.sa_dir, args.server)
        if args.worker:
            return worker(args.worker, target)
        return probe(args.probe, target, args.serving)

    import tempfile

    import yaml

    with control_plane(args.kubeconfig) as kubeconfig, tempfile.TemporaryDirectory() as tmp:
        doc = yaml.safe_load(kubeconfig.read_text())
        server = str(next(c["cluster"] for c in doc["clusters"])["server"])
        sa_dir = None
        if args.auth == "in-cluster":
            sa_dir = service_account_dir(kubeconfig, server, Path(tmp))
        target = Target(args.auth, kubeconfig, sa_dir, server)
        prepare_claim(kubeconfig)
        print(
            f"API server {server}, auth {args.auth}, python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        measure(target, args.count, args.patches or args.count, args.blocks)
        probes(target, args.probes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
