"""A real Kubernetes control plane run as local processes, for tests and the demo.

Usage from tests (``tests/conftest.py`` has a session fixture ``cluster``)::

    with Cluster() as c:
        c.register_node("gpu-node-0")
        c.kubectl("get", "nodes")
        api = c.api_client()          # kubernetes.client.ApiClient, admin identity

From a shell: ``python -m e2e.cluster up`` (see ``e2e.cluster.cli``).

Invariants:
- ``up()`` returns only when the cluster is usable: the API server is ready, the controller-manager
  and scheduler are healthy, and the ``default`` ServiceAccount exists (pods can be created). On any
  failure it tears down what it started and raises ``ClusterError`` with each component's log tail.
- Every component is a process group registered in ``e2e.procs``; ``down()`` kills them all and is
  idempotent; atexit, signal handlers and the parent-death signal cover the cases it is not called.
- The work directory (PKI, kubeconfigs, etcd data, logs) is created once; the API server restarts on
  the same port with the same certificates, so kubeconfigs and clients stay valid.
- Simulated nodes (``register_node``) get a Lease renewed every 10 s by a daemon thread, so the
  node-lifecycle controller never taints them unreachable, however long a session runs.
- A simulated node has no kubelet: no pod placed there ever starts, and none is ever confirmed
  gone. So it carries the NoSchedule taint ``SIMULATED_TAINT``, which only the project's own pods
  meant for it tolerate (``SIMULATED_TOLERATION``), and the same thread stands in for the kubelet
  at deletion: a pod bound to a simulated node that is being deleted is removed at once, so
  deleting its namespace never waits for ever.
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from e2e import binaries, procs, waiting
from e2e.cluster import certs, components, kubeconfigs
from e2e.cluster.components import APISERVER, CONTROLLER_MANAGER, ETCD, SCHEDULER, START_ORDER

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

LEASE_RENEW_S = 10.0
# The taint of a node without a kubelet, and what a pod meant for one carries.
SIMULATED_TAINT_KEY = "dra-gpu.test/no-kubelet"
SIMULATED_TAINT: Mapping[str, str] = {
    "key": SIMULATED_TAINT_KEY,
    "value": "true",
    "effect": "NoSchedule",
}
SIMULATED_TOLERATION: Mapping[str, str] = {
    "key": SIMULATED_TAINT_KEY,
    "operator": "Exists",
    "effect": "NoSchedule",
}
LOG_TAIL_LINES = 40


class ClusterError(RuntimeError):
    """The control plane failed to start or a command against it failed."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def node_manifest(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Node object as a kubelet would register it (labels, capacity; status set separately),
    with the taint that keeps pods not meant for a node without a kubelet away."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": {"taints": [dict(SIMULATED_TAINT)]},
    }


def node_status(now: datetime.datetime) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated node registered by the e2e harness",
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "simulated", "operatingSystem": "linux"},
        }
    }


def _micro_time(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Cluster:
    """One local control plane. Not thread-safe except where noted (``register_node``)."""

    def __init__(
        self,
        *,
        workdir: Path | None = None,
        versions: binaries.Versions | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        startup_timeout_s: float = 180.0,
        log: Callable[[str], None] = _stderr,
        binary_overrides: Mapping[str, Path] | None = None,
    ) -> None:
        """``binary_overrides``: a binary to run instead of the cached build of a component
        (``bench/scale.py --scheduler patched``: a kube-scheduler built with a patch)."""
        self._own_workdir = workdir is None
        base = workdir or Path(tempfile.mkdtemp(prefix="dra-gpu-cluster-"))
        self.workdir: Path = base.resolve()
        self.versions = versions or binaries.Versions.from_env()
        self._feature_gates = dict(feature_gates or {})
        self._extra_args = {k: tuple(v) for k, v in (extra_args or {}).items()}
        self._timeout = startup_timeout_s
        self._log = log
        self._layout: components.Layout | None = None
        self._overrides = dict(binary_overrides or {})
        self._bins: dict[str, Path] = dict(self._overrides)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._client: ApiClient | None = None
        self._nodes: set[str] = set()
        self._nodes_lock = threading.Lock()
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None
        # Seconds from the first process start to each component being ready (last up()).
        self.startup_seconds: dict[str, float] = {}

    # ----- paths and identity -------------------------------------------------------------

    @property
    def layout(self) -> components.Layout:
        if self._layout is None:
            raise ClusterError("the cluster has not been started (call up())")
        return self._layout

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def server(self) -> str:
        return self.layout.server

    @property
    def ca_cert(self) -> Path:
        return self.layout.pki.ca.cert

    def bin(self, name: str) -> Path:
        """Path of a cached binary (``kubectl``, ``kubelet``...), building it if missing."""
        if name not in self._bins:
            self._bins.update(binaries.ensure([name], versions=self.versions, log=self._log))
        return self._bins[name]

    # ----- lifecycle ----------------------------------------------------------------------

    def up(self) -> Cluster:
        self._stop_heartbeat.clear()
        stock = [c for c in binaries.CONTROL_PLANE if c not in self._overrides]
        self._bins.update(binaries.ensure(stock, versions=self.versions, log=self._log))
        ports = components.Ports(*procs.free_ports(5))
        self._layout = components.Layout(
            workdir=self.workdir,
            ports=ports,
            feature_gates=self._feature_gates,
            extra_args=self._extra_args,
        )
        self._write_identities()
        try:
            self._boot()
        except BaseException as exc:
            tail = self.logs()
            self.down(remove_workdir=False)
            if isinstance(exc, ClusterError):
                raise ClusterError(f"{exc}\n{tail}") from exc
            raise
        self._heartbeat = threading.Thread(target=self._renew_leases, daemon=True)
        self._heartbeat.start()
        return self

    def _boot(self) -> None:
        """Start the components in dependency order, recording when each became ready."""
        start = time.monotonic()
        self.startup_seconds.clear()

        def mark(phase: str) -> None:
            self.startup_seconds[phase] = round(time.monotonic() - start, 2)

        self._start(ETCD)
        self._wait_healthy(ETCD)
        mark(ETCD)
        self._start(APISERVER)
        self._wait_healthy(APISERVER)
        mark(APISERVER)
        self._start(CONTROLLER_MANAGER)
        self._start(SCHEDULER)
        self._wait_healthy(CONTROLLER_MANAGER)
        mark(CONTROLLER_MANAGER)
        self._wait_healthy(SCHEDULER)
        mark(SCHEDULER)
        # Pods need their ServiceAccount to exist. The controller-manager's serviceaccount
        # controller creates `default` seconds after it reports healthy; creating it here (the
        # controller then finds it present) makes the cluster usable that much sooner.
        sa = b'{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default"}}'
        self._wait_for(
            lambda: self._post("/api/v1/namespaces/default/serviceaccounts", sa) in (201, 409),
            what="the default ServiceAccount",
        )
        mark("default-serviceaccount")

    def down(self, *, remove_workdir: bool = True) -> None:
        """Stop every component (idempotent); remove the work directory if this object made it."""
        self._stop_heartbeat.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=15)
            self._heartbeat = None
        if self._client is not None:
            self._client.close()
            self._client = None
        running = [self._procs.pop(n) for n in reversed(START_ORDER) if n in self._procs]
        # No grace period: the cluster's state is thrown away, and a graceful API server
        # shutdown would only wait on an etcd that is going away at the same moment.
        procs.stop_many(running, grace_s=0.0)
        if remove_workdir and self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            # Kept for its logs; etcd's data (a 64 MB preallocated WAL) helps no post-mortem.
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not isinstance(exc, ClusterError):
            self._log(self.logs())
        self.down()

    def stop_apiserver(self) -> None:
        """Stop the API server (SIGTERM; SIGKILL after 1 s: its graceful shutdown takes > 5 s)."""
        proc = self._procs.pop(APISERVER, None)
        if proc is not None:
            procs.stop(proc, grace_s=1.0)

    def start_apiserver(self, *, restart_controllers: bool = True) -> None:
        """Start the API server again on the same port with the same certificates; wait ready.

        Then restart the controller-manager and scheduler (always if they exited: the
        controller-manager gives up when the API server vanishes while it initialises). A client
        that reconnects while a new API server is still loading its RBAC cache gets "forbidden",
        and client-go then backs off: measured, the scheduler took ~45 s to notice a new pod after
        a 20 s outage. Fresh processes are ready within about a second instead.
        """
        if APISERVER not in self._procs:
            self._start(APISERVER)
        self._wait_healthy(APISERVER)
        for name in (CONTROLLER_MANAGER, SCHEDULER):
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is None and not restart_controllers:
                continue
            if proc is not None:
                procs.stop(proc, grace_s=0.0)
            self._start(name)
        for name in (CONTROLLER_MANAGER, SCHEDULER):
            self._wait_healthy(name)

    # ----- clients ------------------------------------------------------------------------

    def api_client(self) -> ApiClient:
        """A new ``kubernetes.client.ApiClient`` with the admin identity (caller closes it)."""
        from kubernetes import config

        client: ApiClient = config.new_client_from_config(config_file=str(self.kubeconfig))
        return client

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run kubectl as admin; return stdout. Raises ClusterError (with stderr) on failure."""
        argv = [str(self.bin("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}"
            )
        return proc.stdout

    def server_dry_run(self, documents: str, *, field_manager: str) -> list[str]:
        """Server-side apply of ``documents`` with dry-run: the API server validates and admits
        each object (schema, CEL, admission) and stores nothing. Returns kubectl's line for each
        object it accepted; raises ClusterError (kubectl's stderr) if one was refused."""
        out = self.kubectl(
            *("apply", "--server-side", "--dry-run=server", f"--field-manager={field_manager}"),
            *("-f", "-"),
            input=documents,
        )
        return [line for line in out.splitlines() if "serverside-applied" in line]

    def issue_client_cert(self, cn: str, orgs: Sequence[str] = ()) -> tuple[Path, Path]:
        """A client certificate (CN = user, O = groups) signed by the cluster CA: (cert, key)."""
        out = self._issued_pair("clients", cn)
        certs.issue_client_cert(self.layout.pki.ca, out, cn=cn, orgs=orgs)
        return out.cert, out.key

    def issue_serving_cert(self, name: str, hosts: Sequence[str]) -> tuple[Path, Path]:
        """A TLS serving certificate for ``hosts`` (e.g. a webhook on 127.0.0.1): (cert, key)."""
        out = self._issued_pair("serving", name)
        certs.issue_serving_cert(self.layout.pki.ca, out, cn=name, hosts=hosts)
        return out.cert, out.key

    def _issued_pair(self, kind: str, name: str) -> certs.CertPair:
        directory, stem = self.workdir / "pki" / kind, certs.safe_stem(name)
        return certs.CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")

    def write_kubeconfig(self, path: Path, cert: Path, key: Path) -> Path:
        return kubeconfigs.write_kubeconfig(
            path, server=self.server, ca=self.ca_cert, cert=cert, key=key
        )

    # ----- objects ------------------------------------------------------------------------

    def register_node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Create (or relabel) a Ready Node for a simulated node, tainted ``SIMULATED_TAINT``;
        returns the Node as a dict."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self._admin()
        core = client.CoreV1Api(api)
        try:
            manifest: Any = node_manifest(name, labels)  # the client accepts plain dicts
            core.create_node(body=manifest, _request_timeout=30)
        except ApiException as exc:
            if exc.status != 409:
                raise
            patch = {"metadata": {"labels": labels or {}}, "spec": manifest["spec"]}
            core.patch_node(name, patch, _request_timeout=30)
        now = datetime.datetime.now(datetime.UTC)
        node = core.patch_node_status(name, node_status(now), _request_timeout=30)
        self._renew_lease(name, now)
        with self._nodes_lock:
            self._nodes.add(name)
        result: dict[str, Any] = api.sanitize_for_serialization(node)
        return result

    def unregister_node(self, name: str) -> None:
        """Stop renewing a simulated node's lease and delete the Node (its slices and pods go
        with it, by owner and by the pod GC)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self._nodes_lock:
            self._nodes.discard(name)
        try:
            client.CoreV1Api(self._admin()).delete_node(name, _request_timeout=30)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def create_namespace(self, name: str) -> None:
        """Create a namespace and wait until its ``default`` ServiceAccount exists."""
        manifest = f'{{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{name}"}}}}'
        self.kubectl("apply", "-f", "-", input=manifest)
        self._wait_for(
            lambda: self._get(f"/api/v1/namespaces/{name}/serviceaccounts/default") == 200,
            what=f"the default ServiceAccount of namespace {name}",
        )

    def logs(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of each component's log, headed by its name."""
        if self._layout is None:
            return "(cluster never started: no logs)"
        parts = []
        for name in START_ORDER:
            path = self._layout.log(name)
            if not path.is_file():
                continue
            parts.append(f"===== {name} ({path}) =====\n" + procs.log_tail(path, lines))
        return "\n".join(parts)

    # ----- internals ----------------------------------------------------------------------

    def _write_identities(self) -> None:
        layout = self.layout
        pki = certs.load_pki(layout.pki.dir) if layout.pki.ca.key.is_file() else None
        pki = pki or certs.create_pki(layout.pki.dir)
        identities = {
            layout.admin_kubeconfig: pki.admin,
            layout.kubeconfig(CONTROLLER_MANAGER): pki.controller_manager,
            layout.kubeconfig(SCHEDULER): pki.scheduler,
        }
        for path, pair in identities.items():
            kubeconfigs.write_kubeconfig(
                path, server=layout.server, ca=pki.ca.cert, cert=pair.cert, key=pair.key
            )

    def _start(self, name: str) -> None:
        layout = self.layout
        argv = components.argv(name, self._bins[name], layout)
        log = layout.log(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            fh.write(f"\n# {time.strftime('%H:%M:%S')} starting: {' '.join(argv)}\n")
        self._procs[name] = procs.spawn(argv, log_path=log)

    def _wait_healthy(self, name: str) -> None:
        url = components.health_url(name, self.layout)

        def healthy() -> bool:
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ClusterError(f"{name} exited (code {code}) before it became healthy")
            return self._get(url) == 200

        self._wait_for(healthy, what=f"{name} at {url}")

    def _wait_for(self, check: Callable[[], bool], *, what: str) -> None:
        # Polled often: the start-up time of every test session and benchmark adds these up.
        try:
            waiting.wait_for(what, check, timeout=self._timeout, every=0.1)
        except waiting.WaitTimeout as e:
            raise ClusterError(str(e)) from None  # the harness fails with its own error type

    def _ssl_context(self, url: str) -> ssl.SSLContext:
        if url.startswith(self.layout.server):
            pki = self.layout.pki
            ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
            ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
            return ctx
        # Controller-manager and scheduler serve a self-signed certificate of their own.
        return ssl._create_unverified_context()

    def _get(self, url_or_path: str) -> int | None:
        """HTTP status of a GET (admin identity for the API server); None if unreachable."""
        return self._request(url_or_path)

    def _post(self, path: str, body: bytes) -> int | None:
        return self._request(path, body=body)

    def _request(self, url_or_path: str, *, body: bytes | None = None) -> int | None:
        url = url_or_path if "://" in url_or_path else self.layout.server + url_or_path
        ctx = self._ssl_context(url) if url.startswith("https") else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        request = urllib.request.Request(url, data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ssl.SSLError):
            return None

    def _admin(self) -> ApiClient:
        if self._client is None:
            self._client = self.api_client()
        return self._client

    def _renew_lease(self, name: str, now: datetime.datetime) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        coord = client.CoordinationV1Api(self._admin())
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _micro_time(now)}
        try:
            coord.patch_namespaced_lease(
                name, "kube-node-lease", {"spec": spec}, _request_timeout=5
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body: Any = {"metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec}
            coord.create_namespaced_lease("kube-node-lease", body, _request_timeout=5)

    def _renew_leases(self) -> None:
        while not self._stop_heartbeat.wait(LEASE_RENEW_S):
            with self._nodes_lock:
                nodes = sorted(self._nodes)
            for name in nodes:
                # The API server may be stopped on purpose (stop_apiserver): keep trying.
                with contextlib.suppress(Exception):
                    self._renew_lease(name, datetime.datetime.now(datetime.UTC))
                with contextlib.suppress(Exception):
                    self._remove_deleted_pods(name)

    def _remove_deleted_pods(self, node: str) -> None:
        """What the kubelet would confirm: pods on ``node`` being deleted are gone (grace 0)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self._admin()
        core = client.CoreV1Api(api)
        listed = core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=5
        )
        pods: list[dict[str, Any]] = api.sanitize_for_serialization(listed)["items"]
        for pod in pods:
            meta = pod["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            try:
                core.delete_namespaced_pod(
                    meta["name"], meta["namespace"], grace_period_seconds=0, _request_timeout=5
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
