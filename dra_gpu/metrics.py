"""Prometheus metrics of the kubelet plugin and the controller, served at ``--metrics-address``.

Each program owns one registry (not the library's global one, so two instances in one test
process do not collide) and measures at one place per concern: the plugin around its prepare
handler (a wrapper with the same interface), the controller around the webhook's reviewer and
the reconciler. Gauges that describe state (prepared claims, published devices, leadership) are
read when scraped, so they cannot drift from what the program holds.

Label values are bounded: operation, result, error kind (an exception class name), device type
and health; never a claim, pod or device name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from dra_gpu.controller.reconciling import Reconciles

# Prepare is milliseconds when warm, seconds when the API server or the disk is slow.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A driver reload is seconds; an upgrade that installs a driver, minutes.
OUTAGE_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class AddressError(ValueError):
    """``--metrics-address`` is not ``HOST:PORT``."""


def parse_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::1]:9090`` for IPv6) as a pair; None for the empty string (off)."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise AddressError(f"metrics address must be HOST:PORT (port 0..65535), got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(address: tuple[str, int], registry: CollectorRegistry) -> Callable[[], None]:
    """Serve ``/metrics`` in a daemon thread; returns the function that stops it."""
    server, thread = start_http_server(address[1], addr=address[0], registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


# --- kubelet plugin ------------------------------------------------------------------------


class PluginMetrics:
    """What the plugin does, as Prometheus series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter(
            "dra_gpu_plugin_calls",
            "NodePrepareResources / NodeUnprepareResources calls from the kubelet",
            ["operation"],
            registry=r,
        )
        self.claims = Counter(
            "dra_gpu_plugin_claims",
            "Claims prepared or unprepared, by result and error kind",
            ["operation", "result", "error_kind"],
            registry=r,
        )
        self.latency = Histogram(
            "dra_gpu_plugin_call_duration_seconds",
            "Time to answer one kubelet call (all its claims)",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "dra_gpu_plugin_calls_in_flight",
            "Kubelet calls being answered now",
            ["operation"],
            registry=r,
        )
        self.rediscovery_changes = Counter(
            "dra_gpu_plugin_rediscovery_changes",
            "Re-discoveries that changed the published devices",
            registry=r,
        )
        self.nvml_latency = Histogram(
            "dra_gpu_plugin_nvml_call_duration_seconds",
            "Time of one NVML call, by NVML function",
            ["function"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.nvml_failures = Counter(
            "dra_gpu_plugin_nvml_call_failures",
            "NVML calls that failed or did not return in time, by NVML function",
            ["function", "reason"],
            registry=r,
        )

        self.claim_status_updates = Counter(
            "dra_gpu_plugin_claim_device_status_updates",
            "Writes of prepared claims' status.devices, by result (written, unchanged, retry, "
            "dropped, unsupported)",
            ["result"],
            registry=r,
        )
        self.driver_outages = Counter(
            "dra_gpu_plugin_driver_outages",
            "Times the GPU driver became unavailable (unloaded, or NVML unusable)",
            registry=r,
        )
        self.driver_unavailable = Gauge(
            "dra_gpu_plugin_driver_unavailable",
            "1 while the GPU driver is unavailable or its devices wait for re-discovery",
            registry=r,
        )
        self.driver_outage_seconds = Histogram(
            "dra_gpu_plugin_driver_outage_duration_seconds",
            "Length of each GPU driver outage, from the first look that found it out to the "
            "re-discovery after it came back",
            buckets=OUTAGE_BUCKETS,
            registry=r,
        )

    def driver_outage_began(self) -> None:
        """The GPU driver went out (unloaded for an upgrade, a version mismatch)."""
        self.driver_outages.inc()
        self.driver_unavailable.set(1)

    def driver_outage_ended(self, seconds: float) -> None:
        """The driver is back and its devices were re-discovered, ``seconds`` after it went."""
        self.driver_outage_seconds.observe(seconds)
        self.driver_unavailable.set(0)

    def claim_status(self, result: str) -> None:
        """Observer for the device status writer: one attempt ended with ``result``."""
        self.claim_status_updates.labels(result).inc()

    def nvml_call(self, function: str, seconds: float, outcome: str) -> None:
        """Observer for the NVML backend: one call of ``function`` ended with ``outcome``."""
        self.nvml_latency.labels(function).observe(seconds)
        if outcome != "ok":
            self.nvml_failures.labels(function, outcome).inc()

    # --- a kit step (kubeletplugin.driver.Step): each call counted and timed ---------------------

    def started(self, operation: str) -> None:
        self.calls.labels(operation).inc()
        self.in_flight.labels(operation).inc()

    def prepared(self, refs: Sequence[Any], results: Mapping[Any, Any], seconds: float) -> None:
        self._ended("prepare", seconds)
        for result in results.values():
            self._count("prepare", (result.kind or "Error") if result.error else "")

    def unprepared(self, refs: Sequence[Any], errors: Mapping[Any, str], seconds: float) -> None:
        self._ended("unprepare", seconds)
        for error in errors.values():
            self._count("unprepare", "Error" if error else "")

    def _ended(self, operation: str, seconds: float) -> None:
        self.latency.labels(operation).observe(seconds)
        self.in_flight.labels(operation).dec()

    def _count(self, operation: str, error_kind: str) -> None:
        result = "error" if error_kind else "ok"
        self.claims.labels(operation, result, error_kind).inc()

    def watch_state(
        self,
        *,
        prepared: Callable[[], tuple[int, int]],
        published: Callable[[], Iterable[tuple[str, str]]],
        checkpoint_writes: Callable[[], tuple[int, int]],
    ) -> None:
        """Read at scrape time: ``prepared()`` -> (claims, devices); ``published()`` -> (type,
        health) per published device; ``checkpoint_writes()`` -> (writes, fsynced writes)."""
        self.registry.register(_StateCollector(prepared, published, checkpoint_writes))


class _StateCollector(Collector):
    def __init__(
        self,
        prepared: Callable[[], tuple[int, int]],
        published: Callable[[], Iterable[tuple[str, str]]],
        checkpoint_writes: Callable[[], tuple[int, int]],
    ) -> None:
        self._prepared, self._published = prepared, published
        self._checkpoint_writes = checkpoint_writes

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        claims, devices = self._prepared()
        yield GaugeMetricFamily(
            "dra_gpu_plugin_prepared_claims", "Claims prepared on this node", value=claims
        )
        yield GaugeMetricFamily(
            "dra_gpu_plugin_prepared_devices", "Devices in prepared claims", value=devices
        )
        family = GaugeMetricFamily(
            "dra_gpu_plugin_published_devices",
            "Devices in this node's ResourceSlices",
            labels=["type", "health"],
        )
        counts: dict[tuple[str, str], int] = {}
        for key in self._published():
            counts[key] = counts.get(key, 0) + 1
        for (device_type, health), n in sorted(counts.items()):
            family.add_metric([device_type, health], n)
        yield family
        writes, durable = self._checkpoint_writes()
        written = CounterMetricFamily(
            "dra_gpu_plugin_checkpoint_writes",
            "Checkpoint files written since start, by whether they were fsynced",
            labels=["durable"],
        )
        written.add_metric(["true"], durable)
        written.add_metric(["false"], writes - durable)
        yield written


# --- controller ------------------------------------------------------------------------------


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reviews = Counter(
            "dra_gpu_webhook_reviews",
            "Admission reviews answered, by object kind and verdict",
            ["kind", "verdict"],
            registry=r,
        )
        self.review_latency = Histogram(
            "dra_gpu_webhook_review_duration_seconds",
            "Time to decide one admission review",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.reconciles = Counter(
            "dra_gpu_deviceclass_reconciles",
            "DeviceClass reconcile passes, by result",
            ["result"],
            registry=r,
        )
        self.leader = Gauge(
            "dra_gpu_controller_leader", "1 while this replica holds the lease", registry=r
        )

    def reviewer(
        self, review: Callable[[Mapping[str, Any]], dict[str, Any]]
    ) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        """``review`` with its answers counted (allowed, warned, refused) and timed."""

        def measured(body: Mapping[str, Any]) -> dict[str, Any]:
            start = time.perf_counter()
            answer = review(body)
            self.review_latency.observe(time.perf_counter() - start)
            response = answer.get("response") or {}
            verdict = (
                "refused"
                if not response.get("allowed", True)
                else "warned"
                if response.get("warnings")
                else "allowed"
            )
            kind = str(((body.get("request") or {}).get("kind") or {}).get("kind") or "unknown")
            self.reviews.labels(_bounded_kind(kind), verdict).inc()
            return answer

        return measured

    def watch_leader(self, is_leader: Callable[[], bool]) -> None:
        self.leader.set_function(lambda: 1.0 if is_leader() else 0.0)

    def counted(self, reconciler: Reconciles) -> Reconciles:
        return _CountedReconciler(reconciler, self.reconciles)


class _CountedReconciler:
    def __init__(self, inner: Reconciles, counter: Counter) -> None:
        self._inner, self._counter = inner, counter

    def reconcile_once(self) -> tuple[str, ...]:
        try:
            failed = self._inner.reconcile_once()
        except Exception:
            self._counter.labels("error").inc()
            raise
        self._counter.labels("failed" if failed else "ok").inc()
        return failed


_REVIEWED_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass"})


def _bounded_kind(kind: str) -> str:
    return kind if kind in _REVIEWED_KINDS else "other"
