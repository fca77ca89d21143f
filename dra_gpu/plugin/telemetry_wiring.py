"""Builds and starts the telemetry loop of a running plugin (:class:`lifecycle.KubeletPlugin`
calls :func:`start` once it serves the kubelet, and only with the metrics endpoint on)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dra_gpu import DRIVER_NAME
from dra_gpu.plugin import settings as plugin_settings
from dra_gpu.plugin import telemetry

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from dra_gpu.devices.model import Device
    from dra_gpu.kube.client import KubeClient
    from dra_gpu.plugin.platforms import NvmlObserver, Platform
    from dra_gpu.prepare.checkpoint import CheckpointStore, ClaimRecord

log = logging.getLogger(__name__)


def idle_event(
    involved: Mapping[str, str], message: str, *, node: str, driver: str = DRIVER_NAME
) -> dict[str, Any]:
    """The ``GpuIdle`` Warning about ``involved`` (a pod or the claim), in its namespace and
    reported by ``node``: what the chart's policy ``claim-events`` admits (source.host must be
    the node the plugin's token is bound to)."""
    from dra_gpu.kubeletplugin import events

    return events.warning_event(
        involved,
        namespace=involved.get("namespace") or "default",
        reason=telemetry.REASON_IDLE,
        message=message,
        host=node,
        source=events.component(driver),
    )


def start(
    settings: plugin_settings.Settings,
    *,
    platform: Platform,
    client: KubeClient,
    devices: Callable[[], Sequence[Device]],
    store: CheckpointStore,
    registry: CollectorRegistry,
    stop: threading.Event,
    observe: NvmlObserver | None = None,
    health_events: Callable[[], Mapping[tuple[str, str], int]] = dict,
) -> telemetry.Telemetry | None:
    """The started loop, its series registered on ``registry``; None when switched off.
    ``health_events``: (GPU UUID, kind) -> count of the XID/ECC events the health monitor saw."""
    if settings.telemetry_interval_s is None:
        return None
    from dra_gpu.kubeletplugin import events
    from dra_gpu.plugin.claim_pods import ClaimPods
    from dra_gpu.plugin.telemetry_metrics import TelemetryCollector
    from dra_gpu.prepare import claims

    fetcher = claims.KubeClaimFetcher(client)
    node = settings.node_name

    def post(involved: Mapping[str, str], message: str) -> None:
        events.post(client, idle_event(involved, message, node=node, driver=settings.driver_name))

    def prepared() -> Mapping[str, ClaimRecord]:
        return store.load().claims

    loop = telemetry.Telemetry(
        node=node,
        sampler=platform.usage(settings.state_dir, observe=observe),
        devices=devices,
        claims=prepared,
        pods=ClaimPods(lambda ns, name: fetcher.get_claim(namespace=ns, name=name)),
        interval_s=settings.telemetry_interval_s,
        idle=(
            telemetry.IdleSettings(settings.idle_after_s, settings.idle_threshold)
            if settings.idle_after_s is not None
            else None
        ),
        post=post,
    )
    registry.register(TelemetryCollector(lambda: loop.snapshot, health_events))
    loop.start(stop)
    log.info(
        "telemetry every %gs%s",
        settings.telemetry_interval_s,
        f", idle claims reported after {settings.idle_after_s:g}s" if settings.idle_after_s else "",
    )
    return loop
