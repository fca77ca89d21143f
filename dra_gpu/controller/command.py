"""``dra-gpu controller``: flags, and the lifecycle of the controller's threads.

Threads: the webhook server (every replica), the leader elector, the DeviceClass watch and the
reconcile loop (acts only while leading). SIGTERM/SIGINT stop them in order: the reconciler
first, then the elector releases the Lease (so another replica takes over within its retry
period instead of waiting for expiry), then the webhook stops serving.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from dra_gpu import DRIVER_NAME
from dra_gpu.controller import leases

if TYPE_CHECKING:
    from dra_gpu import metrics
    from dra_gpu.controller import certs, electing, serving
    from dra_gpu.kube.client import KubeClient

# Heavy modules (cryptography, pydantic, cel-python, the API client) are imported when the
# command runs, not when the CLI builds its parser: every other subcommand, the kubelet plugin
# above all, would otherwise pay their start-up time and memory.
_DEFAULT_CERT_HOSTS = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger("dra_gpu.controller")

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _default_namespace() -> str:
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    try:
        return _SA_NAMESPACE.read_text().strip() or "kube-system"
    except OSError:
        return "kube-system"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "controller",
        help="keep the DeviceClasses applied and serve the admission webhook",
        description="Cluster-wide controller: DeviceClasses (leader only) and the admission "
        "webhook for ResourceClaims, ResourceClaimTemplates and DeviceClasses (every replica).",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube/config)",
    )
    p.add_argument(
        "--config", type=Path, help="administrators' classes file (YAML), re-read on change"
    )
    p.add_argument(
        "--extended-resource-name",
        metavar="NAME",
        help="extendedResourceName of the gpu.nvidia.com class, e.g. nvidia.com/gpu",
    )
    p.add_argument("--resync-period", type=float, default=30.0, metavar="SECONDS")
    web = p.add_argument_group("admission webhook (served when --webhook-port is given)")
    web.add_argument("--webhook-port", type=int, help="HTTPS port; 0 picks a free one")
    web.add_argument("--webhook-address", default="0.0.0.0", help="address to listen on")
    web.add_argument("--tls-cert-file", type=Path, help="serving certificate (PEM)")
    web.add_argument("--tls-key-file", type=Path, help="its private key (PEM)")
    web.add_argument(
        "--cert-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "dra-gpu-webhook-certs",
        help="where a self-signed CA and certificate are written when no "
        "--tls-cert-file is given; ca.crt there is the caBundle",
    )
    web.add_argument(
        "--cert-hosts",
        default=",".join(_DEFAULT_CERT_HOSTS),
        help="comma-separated names/IPs of the generated certificate",
    )
    le = p.add_argument_group("leader election (coordination.k8s.io/v1 Lease)")
    le.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    le.add_argument("--lease-namespace", default=_default_namespace())
    le.add_argument("--lease-name", default="dra-gpu-controller")
    le.add_argument("--identity", default=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}")
    le.add_argument("--lease-duration", type=float, default=leases.Timing.lease_duration)
    le.add_argument("--renew-deadline", type=float, default=leases.Timing.renew_deadline)
    le.add_argument("--renew-period", type=float, default=leases.Timing.renew_period)
    le.add_argument("--retry-period", type=float, default=leases.Timing.retry_period)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--metrics-address",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics here (default empty: off)",
    )
    p.set_defaults(func=main)


def _start_webhook(
    args: argparse.Namespace, measured: metrics.ControllerMetrics | None, client: KubeClient
) -> tuple[serving.WebhookServer, certs.ReloadingContext]:
    from dra_gpu.controller import admission, certs, published_capacity, registration, serving

    published = published_capacity.PublishedCapacity.of(client)

    def reviewer(admission_review: Mapping[str, Any]) -> dict[str, Any]:
        return admission.review(admission_review, largest=published.get)

    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise SystemExit("--tls-cert-file and --tls-key-file go together")
    if args.tls_cert_file is not None:
        files = certs.CertFiles(cert=args.tls_cert_file, key=args.tls_key_file, ca=None)
    else:
        hosts = [h.strip() for h in args.cert_hosts.split(",") if h.strip()]
        files = certs.ensure_self_signed(args.cert_dir, hosts=hosts)
        log.info("self-signed webhook certificate in use; caBundle: %s", files.ca)
    context = certs.ReloadingContext(files)
    server = serving.WebhookServer(
        host=args.webhook_address,
        port=args.webhook_port,
        context=context.context,
        reviewer=measured.reviewer(reviewer) if measured else reviewer,
    )
    server.start()
    log.info(
        "admission webhook listening on https://%s:%d%s",
        args.webhook_address,
        server.port,
        registration.VALIDATE_PATH,
    )
    return server, context


class _AlwaysLeader:
    """Stands in for the elector with --no-leader-elect (a single replica)."""

    is_leader = True


def _elector(args: argparse.Namespace, client: KubeClient) -> electing.Elector:
    from dra_gpu.controller import electing

    try:
        timing = leases.Timing(
            args.lease_duration, args.renew_deadline, args.renew_period, args.retry_period
        )
    except ValueError as exc:
        raise SystemExit(f"leader election timing: {exc}") from exc
    store = electing.KubeLeaseStore(client, namespace=args.lease_namespace, name=args.lease_name)
    log.info(
        "leader election on lease %s/%s as %s", args.lease_namespace, args.lease_name, args.identity
    )
    return electing.Elector(
        store, identity=args.identity, clock=electing.SystemClock(), timing=timing
    )


def _thread(name: str, target: Callable[..., None], *args: Any, **kwargs: Any) -> threading.Thread:
    t = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
    t.start()
    return t


def _install_signal_handlers(stop: threading.Event) -> None:
    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s received, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from dra_gpu import metrics
    from dra_gpu.controller import classes, reconciling
    from dra_gpu.kube import capabilities
    from dra_gpu.kube.client import connect

    try:
        metrics_address = metrics.parse_address(args.metrics_address)
    except metrics.AddressError as exc:
        raise SystemExit(f"--metrics-address: {exc}") from exc
    measured = metrics.ControllerMetrics() if metrics_address else None
    stop, elector_stop, wake = threading.Event(), threading.Event(), threading.Event()
    _install_signal_handlers(stop)
    try:
        client = connect(args.kubeconfig, default_kubeconfig=True)
    except Exception as exc:
        raise SystemExit(f"cannot load Kubernetes credentials: {exc}") from exc
    webhook = _start_webhook(args, measured, client) if args.webhook_port is not None else None
    owned = {classes.MANAGED_BY_LABEL: classes.MANAGED_BY_VALUE}  # the policy wants the label
    try:
        detected = capabilities.detect_or_none(
            client,
            driver=DRIVER_NAME,
            node=None,
            class_probe=(
                capabilities.probe_class(args.extended_resource_name, labels=owned)
                if args.extended_resource_name
                else None
            ),
        )
    except capabilities.Unsupported as exc:
        raise SystemExit(f"cannot start: {exc}") from exc
    for level, line in capabilities.controller_report(
        detected, extended_resource_name=args.extended_resource_name
    ):
        log.log(level, "%s", line)  # what this cluster supports, and what is refused
    source = reconciling.ClassSource(
        path=args.config, extended_resource_name=args.extended_resource_name
    )
    source.poll()
    elector: electing.Elector | _AlwaysLeader = _AlwaysLeader()
    elector_thread = None
    if args.leader_elect:
        elector = _elector(args, client)
        elector_thread = _thread("elector", elector.run, elector_stop, lambda _: wake.set())
    reconciler: reconciling.Reconciles = reconciling.Reconciler(client, source)
    stop_metrics = None
    if measured is not None and metrics_address is not None:
        measured.watch_leader(lambda: elector.is_leader)
        reconciler = measured.counted(reconciler)
        stop_metrics = metrics.serve(metrics_address, measured.registry)
        log.info("metrics at http://%s:%d/metrics", *metrics_address)
    # The watch thread is a daemon left to die with the process: it may sit in a long request.
    _thread("watch", reconciling.watch_classes, client, stop, wake.set)
    loop = _thread(
        "reconcile",
        reconciling.run,
        reconciler,
        source,
        stop=stop,
        wake=wake,
        is_leader=lambda: elector.is_leader,
        resync_s=args.resync_period,
    )
    wake.set()
    while not stop.wait(10.0):
        if webhook is not None:
            webhook[1].maybe_reload()
    # Order matters: stop writing, then release the Lease, then stop admitting.
    loop.join(timeout=30)
    elector_stop.set()
    if elector_thread is not None:
        elector_thread.join(timeout=10)
    if webhook is not None:
        webhook[0].stop()
    if stop_metrics is not None:
        stop_metrics()
    log.info("stopped")
    return 0
