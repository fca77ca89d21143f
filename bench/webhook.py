"""Admission webhook latency: through the real API server, and direct HTTPS POSTs.

Usage: ``.venv/bin/python bench/webhook.py [--count 200] [--kubeconfig PATH]``

Starts the controller (``dra-gpu controller`` as a subprocess, webhook on 127.0.0.1 with a
generated CA) and, unless ``--kubeconfig`` names a running cluster, a local control plane.
Prints p50/p99 (ms) over ``--count`` admissions of a claim with a GpuConfig and a selector,
after a warm-up:

1. ``apiserver+webhook``: ResourceClaim creates with server-side dry-run (``dryRun=All``), so the
   API server does everything but persist, including the webhook call over TLS.
2. ``apiserver alone``: the same creates with the webhook configuration removed: the difference
   is what the webhook adds to a claim create.
3. ``direct POST``: AdmissionReviews POSTed straight to the webhook on one keep-alive TLS
   connection (the webhook's own cost: TLS framing, JSON, config parsing, CEL name checks).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dra_gpu.controller import registration  # noqa: E402
from dra_gpu.kube import errors  # noqa: E402
from dra_gpu.kube.client import KubeClient, connect  # noqa: E402
from e2e import helm, probes, procs, waiting  # noqa: E402
from e2e.cluster import Cluster  # noqa: E402

NS = "bench-webhook"
CONFIG_NAME = "dra-gpu-bench-webhook"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
WARMUP = 20


def claim(i: int) -> dict[str, Any]:
    params = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
    }
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"bench-{i}", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": params},
                    }
                ],
            }
        },
    }


def review(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"uid-{i}",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "namespace": NS,
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": claim(i),
        },
    }


def percentiles(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return f"p50 {q[49]:7.2f} ms   p99 {q[98]:7.2f} ms   (n={len(samples)})"


def measure(count: int, once: Callable[[int], None]) -> list[float]:
    for i in range(WARMUP):
        once(-1 - i)
    samples = []
    for i in range(count):
        t0 = time.perf_counter()
        once(i)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


@contextlib.contextmanager
def control_plane(kubeconfig: str | None) -> Iterator[str]:
    if kubeconfig:
        yield kubeconfig
        return
    with Cluster() as cluster:
        cluster.create_namespace(NS)
        yield str(cluster.kubeconfig)


@contextlib.contextmanager
def controller(kubeconfig: str, workdir: Path) -> Iterator[tuple[int, Path]]:
    (port,) = procs.free_ports(1)
    argv = [
        sys.executable,
        "-m",
        "dra_gpu",
        "controller",
        "--kubeconfig",
        kubeconfig,
        "--webhook-port",
        str(port),
        "--webhook-address",
        "127.0.0.1",
        "--cert-dir",
        str(workdir / "certs"),
        "--no-leader-elect",
        "--log-level",
        "WARNING",
    ]
    proc = procs.spawn(argv, log_path=workdir / "controller.log", env=os.environ)
    ca = workdir / "certs" / "ca.crt"

    def serving() -> bool:
        if proc.poll() is not None:
            raise SystemExit((workdir / "controller.log").read_text())
        return probes.https_healthy(port, ca)

    try:
        waiting.wait_for("the controller's webhook", serving, timeout=60)
        yield port, ca
    finally:
        procs.stop(proc)


def ensure_namespace(client: KubeClient) -> None:
    with contextlib.suppress(errors.AlreadyExists):
        client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})


def register(client: KubeClient, port: int, ca: Path) -> None:
    config = helm.webhook_configuration(
        CONFIG_NAME,
        registration.client_config_url(
            f"https://127.0.0.1:{port}/validate", ca_bundle_pem=ca.read_bytes()
        ),
        namespaces=[NS],
        class_selector={"matchLabels": {"dra-gpu.bench/webhook": "true"}},
    )
    client.request("POST", WEBHOOKS, body=config)
    waiting.wait_for("the webhook to take effect", lambda: webhook_in_effect(client), timeout=30)


def bad_claim() -> dict[str, Any]:
    bad = claim(0)
    bad["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] = "Nope"
    return bad


def webhook_in_effect(client: KubeClient) -> bool:
    try:
        client.call("POST", CLAIMS, query={"dryRun": "All"}, body=bad_claim())
    except errors.ApiError as exc:
        if "denied the request" in exc.message:
            return True
        raise
    return False


def unregister(client: KubeClient) -> None:
    with contextlib.suppress(errors.NotFound):
        client.request("DELETE", f"{WEBHOOKS}/{CONFIG_NAME}")
    waiting.wait_for(
        "the webhook to be out of effect", lambda: not webhook_in_effect(client), timeout=30
    )


def via_apiserver(client: KubeClient, count: int) -> list[float]:
    def once(i: int) -> None:
        client.call("POST", CLAIMS, query={"dryRun": "All"}, body=claim(i))

    return measure(count, once)


def direct(port: int, ca: Path, count: int) -> list[float]:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", port, context=ssl.create_default_context(cafile=str(ca)), timeout=10
    )

    def once(i: int) -> None:
        conn.request(
            "POST",
            "/validate",
            body=json.dumps(review(i)),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(conn.getresponse().read())
        if not answer["response"]["allowed"]:
            raise SystemExit(f"unexpected refusal: {answer}")

    try:
        return measure(count, once)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp,
        control_plane(args.kubeconfig) as kubeconfig,
        controller(kubeconfig, Path(tmp)) as (port, ca),
    ):
        client = connect(Path(kubeconfig))
        ensure_namespace(client)
        unregister(client)
        register(client, port, ca)
        try:
            with_webhook = via_apiserver(client, args.count)
        finally:
            unregister(client)
        alone = via_apiserver(client, args.count)
        posts = direct(port, ca, args.count)
    print(f"webhook latency, {args.count} admissions each, after {WARMUP} warm-up:")
    print(f"  apiserver+webhook (dry-run create): {percentiles(with_webhook)}")
    print(f"  apiserver alone   (dry-run create): {percentiles(alone)}")
    print(f"  direct HTTPS POST to the webhook:   {percentiles(posts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
