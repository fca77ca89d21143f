"""Controller start-up: process start -> DeviceClasses applied and webhook serving, and memory.

Usage: ``.venv/bin/python bench/controller_startup.py [--runs N]``

Starts a local control plane (``e2e.cluster.Cluster``) and N times (default 5): deletes the
built-in DeviceClasses, starts ``python -m dra_gpu controller --no-leader-elect --webhook-port P``
(self-signed certificate in a fresh directory, so each run also pays for generating it), and
times from ``Popen`` to the moment every built-in class exists again and, separately, to the
webhook's first ``/healthz`` answer over HTTPS. One second later it reads the process's resident
memory (VmRSS) and stops it with SIGTERM.

Targets: median start -> classes applied under 2 s; RSS under 100 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plugin_startup import rss_mib  # noqa: E402
from dra_gpu.controller import classes  # noqa: E402
from dra_gpu.kube import errors  # noqa: E402
from dra_gpu.kube.client import KubeClient, connect  # noqa: E402
from e2e import probes, procs, waiting  # noqa: E402

TARGET_CLASSES_S = 2.0
TARGET_RSS_MIB = 100.0
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def delete_builtin_classes(client: KubeClient) -> None:
    for name in classes.BUILTIN_NAMES:
        with contextlib.suppress(errors.NotFound):
            client.request("DELETE", f"{CLASSES}/{name}")
    waiting.wait_for(
        "the built-in classes to be gone", lambda: not present(client), timeout=30, every=0.05
    )


def present(client: KubeClient) -> bool:
    names = {o["metadata"]["name"] for o in client.request("GET", CLASSES).get("items") or []}
    return set(classes.BUILTIN_NAMES) <= names


def one_run(kubeconfig: Path, client: KubeClient) -> tuple[float, float, float]:
    delete_builtin_classes(client)
    (port,) = procs.free_ports(1)
    with tempfile.TemporaryDirectory(prefix="ctlb-") as tmp:
        cert_dir = Path(tmp) / "certs"
        ca = cert_dir / "ca.crt"
        argv = [
            *(sys.executable, "-m", "dra_gpu", "controller", "--kubeconfig", str(kubeconfig)),
            *("--no-leader-elect", "--webhook-port", str(port), "--cert-dir", str(cert_dir)),
            *("--log-level", "WARNING"),
        ]
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True)
        try:
            classes_at = serving_at = None
            deadline = started + 30
            while classes_at is None or serving_at is None:
                if proc.poll() is not None:
                    raise RuntimeError(f"the controller exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError("the controller was not ready within 30 s")
                if classes_at is None and present(client):
                    classes_at = time.monotonic()
                if serving_at is None and probes.https_healthy(port, ca, timeout=1):
                    serving_at = time.monotonic()
                time.sleep(0.02)
            time.sleep(1.0)
            rss = rss_mib(proc.pid)
        finally:
            procs.stop(proc, grace_s=15)
    return classes_at - started, serving_at - started, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from e2e.cluster import Cluster

    with Cluster() as cluster:
        client = connect(cluster.kubeconfig)
        try:
            runs = [one_run(cluster.kubeconfig, client) for _ in range(args.runs)]
        finally:
            client.close()
    applied = [a for a, _, _ in runs]
    serving = [s for _, s, _ in runs]
    rss = [r for _, _, r in runs]
    print(f"load average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("start -> DeviceClasses applied: " + ", ".join(f"{a:.3f}" for a in applied) + " s")
    med = statistics.median(applied)
    verdict = "OK" if med < TARGET_CLASSES_S else "OVER TARGET"
    print(f"  median {med:.3f} s (target < {TARGET_CLASSES_S} s): {verdict}")
    print("start -> webhook answers /healthz: " + ", ".join(f"{s:.3f}" for s in serving) + " s")
    print(f"  median {statistics.median(serving):.3f} s (includes a new self-signed certificate)")
    verdict = "OK" if max(rss) < TARGET_RSS_MIB else "OVER TARGET"
    print(f"RSS after start: median {statistics.median(rss):.1f} MiB, max {max(rss):.1f} MiB "
          f"(target < {TARGET_RSS_MIB:.0f} MiB): {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
