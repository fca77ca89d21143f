"""Command lines of the control-plane components (pure: a layout in, an argv out).

Design choices the flags encode, with why:
- Everything listens on 127.0.0.1 only, on ports picked free at startup.
- The API server's endpoint reconciler is off: the ``kubernetes`` Service cannot point at a
  loopback address (Endpoints validation rejects 127.0.0.0/8), so it would only log errors.
- ``--enable-aggregator-routing``: the API server resolves a Service to its endpoints itself (no
  kube-proxy here); that resolver is also the one admission webhooks use. Webhooks served by host
  processes should use ``clientConfig.url`` (https://127.0.0.1:<port>/...).
- Admission: the defaults (which include ServiceAccount, ValidatingAdmissionPolicy and both webhook
  plugins) plus NodeRestriction; authorization Node,RBAC as in a production cluster, so the
  driver's RBAC and node confinement are exercised for real.
- etcd runs without fsync: its data is thrown away with the cluster, and fsync dominates latency.
- Controller-manager and scheduler get their own identities (RBAC has bootstrap roles for both)
  and a ``--cert-dir`` inside the work directory (the default is /var/run/kubernetes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from e2e.cluster import certs

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
START_ORDER = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class Layout:
    """Where one cluster keeps its files, and what it listens on."""

    workdir: Path
    ports: Ports
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @property
    def pki(self) -> certs.Pki:
        return certs.pki_layout(self.workdir / "pki")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.etcd_client}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def kubeconfig(self, component: str) -> Path:
        return self.workdir / "kubeconfigs" / f"{component}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"


def gates_from(text: str | None) -> dict[str, bool]:
    """Feature gates written as the components' flag takes them (``A=false,B=true``), e.g.
    ``DRA_GPU_FEATURE_GATES``: a run of the harness against gates other than the defaults."""
    gates: dict[str, bool] = {}
    for item in (text or "").replace(" ", ",").split(","):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false") or not name:
            raise ValueError(f"feature gate {item!r} is not of the form Name=true|false")
        gates[name] = value.lower() == "true"
    return gates


def _gates(layout: Layout) -> list[str]:
    if not layout.feature_gates:
        return []
    value = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(layout.feature_gates.items()))
    return [f"--feature-gates={value}"]


def etcd_argv(binary: Path, layout: Layout) -> list[str]:
    peer = f"http://127.0.0.1:{layout.ports.etcd_peer}"
    return [
        str(binary),
        "--name=default",
        f"--data-dir={layout.workdir / 'etcd'}",
        f"--listen-client-urls={layout.etcd_url}",
        f"--advertise-client-urls={layout.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
        *layout.extra_args.get(ETCD, ()),
    ]


def apiserver_argv(binary: Path, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(binary),
        f"--etcd-servers={layout.etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={layout.ports.apiserver}",
        f"--cert-dir={layout.workdir / 'apiserver'}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
        f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
        # Real nodes' names resolve nowhere; reach their kubelets (logs, exec) by InternalIP.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.sa_public}",
        f"--service-account-signing-key-file={pki.sa_private}",
        f"--service-cluster-ip-range={certs.SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--enable-aggregator-routing=true",
        *_gates(layout),
        *layout.extra_args.get(APISERVER, ()),
    ]


def _delegating(layout: Layout, component: str, port: int) -> list[str]:
    """Flags shared by controller-manager and scheduler: identity and their own HTTPS endpoint."""
    kubeconfig = layout.kubeconfig(component)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.workdir / component}",
        "--leader-elect=false",
        *_gates(layout),
    ]


def controller_manager_argv(binary: Path, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(binary),
        *_delegating(layout, CONTROLLER_MANAGER, layout.ports.controller_manager),
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.sa_private}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        *layout.extra_args.get(CONTROLLER_MANAGER, ()),
    ]


def scheduler_argv(binary: Path, layout: Layout) -> list[str]:
    return [
        str(binary),
        *_delegating(layout, SCHEDULER, layout.ports.scheduler),
        *layout.extra_args.get(SCHEDULER, ()),
    ]


def argv(component: str, binary: Path, layout: Layout) -> list[str]:
    builders = {
        ETCD: etcd_argv,
        APISERVER: apiserver_argv,
        CONTROLLER_MANAGER: controller_manager_argv,
        SCHEDULER: scheduler_argv,
    }
    return builders[component](binary, layout)


def health_url(component: str, layout: Layout) -> str:
    """The endpoint that answers 200 once ``component`` is ready to serve."""
    ports = layout.ports
    return {
        ETCD: f"{layout.etcd_url}/health",
        APISERVER: f"{layout.server}/readyz",
        CONTROLLER_MANAGER: f"https://127.0.0.1:{ports.controller_manager}/healthz",
        SCHEDULER: f"https://127.0.0.1:{ports.scheduler}/healthz",
    }[component]
