"""The driver deployed as users deploy it, on the local cluster's real nodes.

``DeployedEnv.up()``:

1. builds the image twice from the repository's Dockerfile with ``docker build``
   (``e2e.images.docker_engine``, ``e2e.images.driver``): tag ``e2e-1`` and tag ``e2e-2`` (the same
   plus a label: the upgrade's second version), saves both, and stops the engine;
2. starts the control plane with the API server reachable from pods: listening on all addresses,
   advertised on a host-local address of its own (``198.19.x.y`` on a port-less bridge), so the
   ``kubernetes`` Service has an endpoint; kube-proxy (``e2e.node.kube_proxy``) makes its ClusterIP
   reachable;
3. starts two real nodes (kubelet + containerd, ``e2e.node``), ``gpu-h200`` and ``gpu-a100``, each
   labelled with the simulated profile its plugin serves, and imports both image archives into
   each node's containerd (``ctr -n k8s.io images import``);
4. prepares the release namespaces (Pod Security ``privileged``, and the label under which
   ``dra-gpu validate``'s check claim gets admin access, as docs/user/install.md says) and
the
   webhook's serving certificate (a ``kubernetes.io/tls`` Secret signed by the cluster CA for
   ``dra-gpu-webhook.dra-gpu.svc``; its CA goes to ``webhook.tls.caBundle``).

The chart is then installed with the real helm, one release per node (``RELEASES``): each node's
kubelet has its own root directory, and the chart's host paths (``kubeletPlugin.kubeletDir``,
``cdiRoot``) are per release, the same way ``e2e/kind/run.sh`` installs one release per profile.
Each release's plugin runs as a GPU node pool (``kubeletPlugin.pools``: one pool per release,
on its node, with the pool's own image tag), so upgrades go pool by pool, the canary
(``ROLLOUT_ORDER[0]``) first; on a cluster whose nodes share one kubelet directory the pools
would be two entries of one release. With ``upgrade_from`` the releases have no pools: the
earlier chart may not know them.
``down()`` stops everything in reverse order and is idempotent.

``DeployedEnv(upgrade_from=REF)``: the first image (``e2e-1``) is built from the tree of the git
ref ``REF`` (``e2e.deployed.source``, exported into the work directory), and ``install`` uses that
tree's chart with its own default values; ``upgrade`` uses this tree's chart, as always.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_gpu.validate.steps import ADMIN_NAMESPACE_LABEL
from e2e import helm
from e2e.cluster import Cluster
from e2e.deployed import source
from e2e.images import driver as driver_image
from e2e.images.base import REPO_ROOT
from e2e.images.docker_engine import DockerEngine
from e2e.node import cleanup as node_cleanup
from e2e.node.binaries import ensure_node_binaries
from e2e.node.kube_proxy import KubeProxy
from e2e.node.kubelet_node import Node

Log = Callable[[str], None]
IMAGE_REPOSITORY = "dra-gpu"
TAGS = ("e2e-1", "e2e-2")
BUILD_LABEL = "dra-gpu.test/build"
PROFILE_LABEL = "dra-gpu.test/profile"
REAL_NODE_SELECTOR = {"dra-gpu.test/real-node": "true"}
DRIVER_DIR = "gpu.nvidia.com"  # the plugin's state directory under the kubelet's plugins dir


@dataclass(frozen=True)
class Release:
    name: str  # the Helm release, its namespace, and the prefix of its objects' names
    node: str
    profile: str
    webhook: bool
    pool: str  # its GPU node pool (kubeletPlugin.pools[0].name)
    scenario: str  # a scenario whose claim fits the pool's GPUs: the gate's prepared claim


RELEASES = (
    Release("dra-gpu", "gpu-h200", "h200x8", webhook=True, pool="h200", scenario="one-gpu"),
    Release(
        "dra-gpu-mig",
        "gpu-a100",
        "a100x4-mig",
        webhook=False,
        pool="a100-mig",
        scenario="mig-by-profile",
    ),
)
# Pool by pool: the canary first, then the rest once the canary passed its gate.
ROLLOUT_ORDER = (RELEASES[1], RELEASES[0])
BROKEN_TAG = "e2e-broken"  # an image tag no node has: a canary that never becomes ready


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def api_address(workdir: Path) -> str:
    """A host-local address for the API server, derived from the work directory: in 198.19.0.0/16,
    the half of the benchmarking range that node IPs (198.18.x.y) do not use."""
    digest = hashlib.sha256(str(workdir).encode()).digest()
    return f"198.19.{digest[0]}.{1 + digest[1] % 254}"


def _digest(workdir: Path) -> str:
    return hashlib.sha256(str(workdir).encode()).hexdigest()[:6]


def nodes_root(workdir: Path) -> Path:
    """Where the kit's nodes have their roots, ``node_root`` each. The kubelet plugin's
    registration socket is <kubeletDir>/plugins_registry/gpu.nvidia.com-<pod UID>-reg.sock, and a
    socket path has at most 107 bytes: with that name, a kubelet root directory may have 21
    (users': /var/lib/kubelet, 16), hence a short root outside the work directory."""
    return Path("/tmp") / f"dg-{_digest(workdir)}"


def node_root(nodes: Path, release: Release) -> Path:
    return nodes / release.node.removeprefix("gpu-")


def release_values(
    release: Release,
    *,
    tag: str,
    node: Node,
    ca_bundle: str,
    pools: bool = True,
    pool_tag: str | None = None,
) -> dict[str, str | bool | int]:
    """The release's chart values; with ``pools`` its plugin is the pool ``release.pool`` on its
    node, on image ``pool_tag`` (default ``tag``)."""
    label = PROFILE_LABEL.replace(".", "\\.")
    values: dict[str, str | bool | int] = {
        "image.repository": IMAGE_REPOSITORY,
        "image.tag": tag,
        "image.pullPolicy": "Never",  # imported into each node; no registry
        "simulate.enabled": True,
        "simulate.profile": release.profile,
        "simulate.nodeSelector." + label: release.profile,
        "kubeletPlugin.kubeletDir": str(node.paths.kubelet_root),
        "kubeletPlugin.cdiRoot": str(node.cdi_root),
        "controller.extendedResourceName": "nvidia.com/gpu",
        "webhook.enabled": release.webhook,
    }
    if release.webhook:
        values["webhook.tls.caBundle"] = ca_bundle
    if pools:
        values["kubeletPlugin.pools[0].name"] = release.pool
        values["kubeletPlugin.pools[0].nodeSelector." + label] = release.profile
        values["kubeletPlugin.pools[0].image.tag"] = pool_tag or tag
    return values


class DeployedEnv:
    def __init__(
        self, *, workdir: Path | None = None, upgrade_from: str | None = None, log: Log = _stderr
    ) -> None:
        self.workdir = (workdir or Path(tempfile.mkdtemp(prefix="dra-gpu-deployed-"))).resolve()
        self.log = log
        self.upgrade_from = upgrade_from
        self.previous: source.Tree | None = None  # exported by up() when upgrade_from is set
        self.api_ip = api_address(self.workdir)
        # Pods reach the API server through the `kubernetes` Service, whose endpoint is the
        # advertised address (the harness's default, 127.0.0.1, cannot be one).
        apiserver = (
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.api_ip}",
            "--endpoint-reconciler-type=lease",
        )
        self.cluster = Cluster(
            workdir=self.workdir / "cluster", extra_args={"kube-apiserver": apiserver}, log=log
        )
        self.nodes: dict[str, Node] = {}
        self.images: dict[str, driver_image.BuiltImage] = {}
        self.api_link = "dragpuapi" + _digest(self.workdir)
        self.proxy: KubeProxy | None = None
        self.nodes_root = nodes_root(self.workdir)
        self.timings: dict[str, float] = {}

    @property
    def archive_dir(self) -> Path:
        """This run's image archives: a concurrent run's build of the same tags must not
        replace them before the nodes import them (it did, through a shared cache path)."""
        return self.workdir / "images"

    # ----- lifecycle ----------------------------------------------------------------------

    def build_images(self) -> None:
        with DockerEngine(log=self.log) as engine:
            for number, tag in enumerate(TAGS, start=1):
                started = time.monotonic()
                ref = f"{IMAGE_REPOSITORY}:{tag}"
                labels = {BUILD_LABEL: str(number)}
                context = self.previous.root if self.previous and number == 1 else REPO_ROOT
                self.images[tag] = driver_image.build(
                    engine,
                    ref,
                    labels=labels,
                    log=self.log,
                    context=context,
                    archive_dir=self.archive_dir,
                )
                self.timings[f"build {tag}"] = time.monotonic() - started
            # Images of earlier source trees, untagged by these builds: the data root is kept
            # between runs, and would otherwise grow with every change.
            engine.docker("image", "prune", "--force")

    def up(self) -> DeployedEnv:
        try:
            # Debian packages first: kube-proxy needs iptables before the first node is up.
            ensure_node_binaries()
            if self.upgrade_from is not None:
                self.previous = source.export(self.upgrade_from, self.workdir / "upgrade-from")
                self.log(f"[deployed] e2e-1 from {self.upgrade_from} ({self.previous.commit})")
            self.build_images()
            # The kit's own host-wide things, reaped as a node's are if this process is killed.
            node_cleanup.register(self._record())
            node_cleanup.add_address_link(self.api_link, self.api_ip)
            self.cluster.up()
            first = RELEASES[0].node
            self.proxy = KubeProxy(
                self.cluster, hostname=first, workdir=self.workdir / "kube-proxy", log=self.log
            ).up()
            for release in RELEASES:
                workdir = node_root(self.nodes_root, release)
                node = Node(self.cluster, name=release.node, workdir=workdir, log=self.log).up()
                self.nodes[release.node] = node
                self.cluster.kubectl(
                    "label", "node", release.node, f"{PROFILE_LABEL}={release.profile}"
                )
                for image in self.images.values():
                    node.ctr("images", "import", str(image.archive))
            shutil.rmtree(self.archive_dir, ignore_errors=True)  # imported; hundreds of MiB
            for release in RELEASES:
                self._prepare_namespace(release)
        except BaseException:
            self.log(self.cluster.logs())
            self.down()
            raise
        return self

    def down(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.down()
        self.nodes.clear()
        if self.proxy is not None:
            self.proxy.down()
            self.proxy = None
        self.cluster.down(remove_workdir=False)
        node_cleanup.clean(self._record())  # the API server's link and the nodes' root

    def _record(self) -> node_cleanup.NodeRecord:
        return node_cleanup.owned_by_this_process(
            self.nodes_root,
            containerd_socket="",
            cgroup="",
            links=(self.api_link,),
            remove_root=True,
        )

    def __enter__(self) -> DeployedEnv:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ----- the chart ----------------------------------------------------------------------

    def _prepare_namespace(self, release: Release) -> None:
        self.cluster.create_namespace(release.name)
        self.cluster.kubectl(
            *("label", "--overwrite", "namespace", release.name),
            "pod-security.kubernetes.io/enforce=privileged",
            f"{ADMIN_NAMESPACE_LABEL}=true",  # validate's check claim: admin access
        )
        if release.webhook:
            service = f"{release.name}-webhook"
            hosts = [f"{service}.{release.name}.svc", f"{service}.{release.name}.svc.cluster.local"]
            cert, key = self.cluster.issue_serving_cert(service, hosts)
            self.cluster.kubectl(
                *("create", "secret", "tls", f"{release.name}-webhook-tls", "-n", release.name),
                f"--cert={cert}",
                f"--key={key}",
            )

    @property
    def pools(self) -> bool:
        """Whether the releases run their plugin as a pool (not with ``upgrade_from``)."""
        return self.upgrade_from is None

    def values(
        self, release: Release, tag: str, pool_tag: str | None = None
    ) -> dict[str, str | bool | int]:
        ca = base64.b64encode(self.cluster.ca_cert.read_bytes()).decode()
        return release_values(
            release,
            tag=tag,
            node=self.nodes[release.node],
            ca_bundle=ca,
            pools=self.pools,
            pool_tag=pool_tag,
        )

    def helm(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        argv = [str(helm.ensure_helm()), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed:\n{proc.stderr}{proc.stdout}")
        return proc

    @property
    def first_chart(self) -> Path:
        """The chart ``install`` uses: the earlier release's with ``upgrade_from``."""
        return self.previous.chart if self.previous is not None else helm.CHART

    def install(self, release: Release, tag: str, *, wait: bool = True) -> str:
        """``helm install``; returns helm's output (NOTES)."""
        return self._apply("install", release, tag, self.first_chart, wait=wait)

    def upgrade(
        self,
        release: Release,
        tag: str,
        *,
        wait: bool = True,
        extra: Sequence[str] = (),
        pool_tag: str | None = None,
    ) -> str:
        """``helm upgrade`` to this tree's chart, with the kit's values on the command line
        (``--set``): what reaches the chart is those and the chart's defaults, as with a
        user's values file (``extra``: more helm flags, e.g. ``--dry-run``; ``pool_tag``: the
        pool's image tag, when not ``tag``)."""
        return self._apply(
            "upgrade", release, tag, helm.CHART, wait=wait, extra=extra, pool_tag=pool_tag
        )

    def _apply(
        self,
        verb: str,
        release: Release,
        tag: str,
        chart: Path,
        *,
        wait: bool,
        extra: Sequence[str] = (),
        pool_tag: str | None = None,
    ) -> str:
        argv = [verb, release.name, str(chart), "--namespace", release.name, *extra]
        if wait:
            argv += ["--wait", "--timeout", "5m"]
        argv += helm.set_args(self.values(release, tag, pool_tag))
        return self.helm(*argv).stdout

    def state_dir(self, node: str) -> Path:
        """The plugin's state directory on ``node`` (its checkpoint), read from the host."""
        return self.nodes[node].paths.plugins_dir / DRIVER_DIR

    def uninstall(self, release: Release) -> str:
        return self.helm("uninstall", release.name, "--namespace", release.name, "--wait").stdout

    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def node_summary(self) -> Mapping[str, str]:
        return {name: str(node.paths.root) for name, node in self.nodes.items()}
