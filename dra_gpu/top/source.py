"""Where ``dra-gpu top`` reads telemetry: each node's kubelet plugin through the API server's
pod proxy (the user's own RBAC: ``get`` on ``pods/proxy`` in the driver's namespace), a
plugin's ``/metrics`` URL, or a Prometheus server's query API. Thin I/O; the text format is
parsed by prometheus-client's parser."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote

from prometheus_client.parser import text_string_to_metric_families

from dra_gpu.errors import UserError
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient
from dra_gpu.top.rows import Sample

PLUGIN_SELECTOR = "app.kubernetes.io/name=dra-gpu,app.kubernetes.io/component=kubelet-plugin"
SERIES_PATTERN = "dra_gpu_(device|pod|claim)_.*"
TIMEOUT_S = 10.0


class SourceError(UserError, RuntimeError):
    """Telemetry cannot be read; the message says from where and why."""


def parse_text(text: str) -> Iterator[Sample]:
    """Samples of the telemetry series in Prometheus text format."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(("dra_gpu_device_", "dra_gpu_pod_", "dra_gpu_claim_")):
                yield s.name, s.labels, float(s.value)


def metrics_port(pod: dict[str, Any]) -> int | None:
    """The plugin container's port named ``metrics``."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == "metrics":
                return int(port["containerPort"])
    return None


def from_plugins(
    client: KubeClient, *, namespace: str, node: str | None
) -> tuple[list[Sample], list[str]]:
    """Samples of every running plugin pod (of ``node`` only, when given), and a warning per
    plugin that could not be read."""
    query = {"labelSelector": PLUGIN_SELECTOR}
    if node is not None:
        query["fieldSelector"] = f"spec.nodeName={node}"
    try:
        pods = client.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods", query=query)
    except errors.ApiError as err:
        raise SourceError(f"cannot list the kubelet plugins in {namespace}: {err}") from err
    samples: list[Sample] = []
    warnings: list[str] = []
    items = [
        p for p in pods.get("items") or () if (p.get("status") or {}).get("phase") == "Running"
    ]
    if not items:
        where = f" on node {node}" if node else ""
        warnings.append(f"no running kubelet plugin pod in namespace {namespace}{where}")
    for pod in items:
        name = pod["metadata"]["name"]
        port = metrics_port(pod)
        if port is None:
            warnings.append(f"{name}: no metrics port (install with metrics.enabled=true)")
            continue
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}:{port}/proxy/metrics"
        try:
            samples.extend(parse_text(client.get_text(path, timeout_s=TIMEOUT_S)))
        except errors.ApiError as err:
            warnings.append(f"{name}: {err}")
    return samples, warnings


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            return str(answer.read().decode(errors="replace"))
    except OSError as err:
        raise SourceError(f"cannot read {url}: {err}") from err


def from_urls(urls: Sequence[str]) -> list[Sample]:
    """Samples of plugins' ``/metrics`` URLs (a port-forward, a node address)."""
    return [s for url in urls for s in parse_text(_get(url))]


def from_prometheus(base_url: str) -> list[Sample]:
    """The latest telemetry samples a Prometheus server holds."""
    query = urllib.parse.urlencode({"query": f'{{__name__=~"{SERIES_PATTERN}"}}'})
    text = _get(f"{base_url.rstrip('/')}/api/v1/query?{query}")
    try:
        answer = json.loads(text)
        vector = answer["data"]["result"]
    except (ValueError, KeyError, TypeError) as err:
        raise SourceError(f"{base_url} did not answer a Prometheus query: {err}") from err
    out: list[Sample] = []
    for item in vector:
        labels = dict(item.get("metric") or {})
        name = labels.pop("__name__", "")
        out.append((name, labels, float(item["value"][1])))
    return out
