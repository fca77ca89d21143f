"""One claim GET (what every prepare does): KubeClient on urllib3, against a bare urllib3 pool
and http.client on the same TLS settings.

Usage: ``.venv/bin/python bench/api_get.py [--count 1000] [--rounds 5] [--kubeconfig PATH]``

Unless ``--kubeconfig`` names a running cluster, starts a local control plane. Creates one
ResourceClaim and GETs it ``--count`` times per round on one thread, the clients in turn
(the order rotates every round), after a warm-up:

1. ``KubeClient``: ``KubeClient.call`` as the plugin makes it (headers, retry policy, framing
   checks, JSON decoding, Warning headers).
2. ``urllib3``: a bare ``HTTPSConnectionPool`` with the same TLS context, ``retries=False``
   and the same headers, JSON decoding and Warning headers: what the client adds on top.
3. ``http.client``: one ``HTTPSConnection`` kept open, the same headers and decoding: what
   urllib3 adds on top of the standard library.

Prints the median over rounds of CPU ms per GET (this process's user+system time: all of it is
the client's) and wall ms per GET. Then the RSS (MiB) of a fresh interpreter that loaded the
kubelet plugin's modules and made one GET.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import urllib3  # noqa: E402

from dra_gpu.kube import credentials, errors  # noqa: E402
from dra_gpu.kube.client import REQUEST_TIMEOUT_S, KubeClient, Reply, connect, parse_warnings  # noqa: E402
from e2e.cluster import Cluster  # noqa: E402

NS = "default"
NAME = "bench-api-get"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
WARMUP = 100
# What the kubelet plugin imports once it serves (dra_gpu.plugin.main.serve and below).
PLUGIN_MODULES = (
    "dra_gpu.plugin.main",
    "dra_gpu.plugin.node_plugin",
    "dra_gpu.plugin.current_devices",
    "dra_gpu.plugin.health_monitor",
    "dra_gpu.kubeletplugin.slice_api",
    "dra_gpu.prepare.claims",
    "dra_gpu.kubeletplugin.events",
    "dra_gpu.kube.capabilities",
)


def urllib3_get(kubeconfig: Path) -> Callable[[str], Reply]:
    """The claim GET over a bare urllib3 pool."""
    creds = credentials.from_kubeconfig(kubeconfig)
    host = urlsplit(creds.host)
    pool = urllib3.HTTPSConnectionPool(
        str(host.hostname), host.port, maxsize=24, ssl_context=creds.ssl_context
    )
    timeout = urllib3.Timeout(connect=5.0, read=REQUEST_TIMEOUT_S)

    def get(path: str) -> Reply:
        headers = {"Accept": "application/json", **creds.auth.headers()}
        resp = pool.urlopen("GET", path, headers=headers, timeout=timeout, retries=False)
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {resp.status}")
        return Reply(json.loads(resp.data), parse_warnings(resp.headers.getlist("Warning")))

    return get


def http_client_get(kubeconfig: Path) -> Callable[[str], Reply]:
    """The claim GET over one kept-open http.client connection."""
    creds = credentials.from_kubeconfig(kubeconfig)
    host = urlsplit(creds.host)
    conn = http.client.HTTPSConnection(
        str(host.hostname), host.port, timeout=REQUEST_TIMEOUT_S, context=creds.ssl_context
    )

    def get(path: str) -> Reply:
        conn.request("GET", path, headers={"Accept": "application/json", **creds.auth.headers()})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {resp.status}")
        return Reply(json.loads(data), parse_warnings(resp.headers.get_all("Warning") or []))

    return get


def per_get(get: Callable[[str], Reply], path: str, count: int) -> tuple[float, float]:
    """CPU and wall milliseconds per GET over ``count`` GETs."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(count):
        get(path)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    return 1000 * (cpu1 - cpu0) / count, 1000 * (wall1 - wall0) / count


def plugin_rss_mib(kubeconfig: Path, path: str) -> float:
    code = "\n".join(
        [
            "import importlib, pathlib",
            f"for m in {PLUGIN_MODULES!r}: importlib.import_module(m)",
            "import grpc",
            "from dra_gpu.kube.client import connect",
            f"connect(pathlib.Path({str(kubeconfig)!r})).request('GET', {path!r})",
            "print(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])",
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


@contextlib.contextmanager
def control_plane(kubeconfig: str | None) -> Iterator[Path]:
    if kubeconfig:
        yield Path(kubeconfig)
        return
    with Cluster() as cluster:
        yield cluster.kubeconfig


def ensure_claim(client: KubeClient) -> str:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
    }
    with contextlib.suppress(errors.AlreadyExists):
        client.request("POST", CLAIMS, body=body)
    return f"{CLAIMS}/{NAME}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    args = parser.parse_args()
    with control_plane(args.kubeconfig) as kubeconfig:
        client = connect(kubeconfig)
        path = ensure_claim(client)
        try:
            clients: dict[str, Callable[[str], Reply]] = {
                "KubeClient": lambda p: client.call("GET", p),
                "urllib3": urllib3_get(kubeconfig),
                "http.client": http_client_get(kubeconfig),
            }
            for get in clients.values():
                assert get(path).body["metadata"]["name"] == NAME
                per_get(get, path, WARMUP)
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
            names = list(clients)
            for i in range(args.rounds):
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    results[name].append(per_get(clients[name], path, args.count))
            rss = plugin_rss_mib(kubeconfig, path)
        finally:
            client.request("DELETE", path)
    print(f"claim GET, {args.rounds} rounds x {args.count}, median over rounds:")
    for name, rows in results.items():
        cpu = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        spread = ", ".join(f"{r[0]:.3f}" for r in rows)
        print(f"  {name:11} cpu/GET {cpu:.3f} ms  wall/GET {wall:.3f} ms  (cpu/round: {spread})")
    print(f"plugin modules + one GET, RSS of a fresh interpreter: {rss:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
