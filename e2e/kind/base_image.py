"""kind's base image, made here from Debian packages and the binaries the project builds.

kind publishes its base image (``kindest/base``) from ``images/base/Dockerfile`` in its own
repository; no registry is reachable here, so this module makes the same image from the same
recipe: a ``debootstrap`` root of the Debian release the driver image uses (the packages kind's
Dockerfile installs), kind's own files from the ``sigs.k8s.io/kind`` module (entrypoint, systemd
units, containerd config, kubelet drop-ins), and the containerd, runc, crictl and CNI plugins built
from their Go modules (``e2e.node_binaries``, ``e2e.kind.tools``). The systemd steps are kind's
Dockerfile's, run with ``docker build --network none``.

Cached by its inputs: the debootstrap root under ``<cache>/kind-base/<key>.tar`` and the image
``localhost/dra-gpu/kind-base:<key>`` in the engine's data root (also in the cache).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from e2e.binaries import cache_root
from e2e.images.base import debian_source, import_rootfs
from e2e.images.docker_engine import DockerEngine, Log
from e2e.kind import tools
from e2e.node.binaries import CONTAINERD, RUNC, ensure_built

REPOSITORY = "localhost/dra-gpu/kind-base"
# kind's Dockerfile's list, less what only rootless or storage add-ons use (fuse-overlayfs,
# nfs-common, open-iscsi, e2fsprogs).
PACKAGES = (
    "systemd",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "libseccomp2",
    "pigz",
    "bash",
    "ca-certificates",
    "curl",
    "jq",
    "procps",
)
# kind's Dockerfile, from its `base` and `build` stages, with the binaries copied in by us.
DOCKERFILE = """\
FROM {rootfs}
COPY files/ /
COPY bin/ /usr/local/bin/
COPY sbin/ /usr/local/sbin/
COPY cni/ /opt/cni/bin/
RUN find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \\
    && rm -f /lib/systemd/system/multi-user.target.wants/* \\
    && rm -f /etc/systemd/system/*.wants/* \\
    && rm -f /lib/systemd/system/local-fs.target.wants/* \\
    && rm -f /lib/systemd/system/sockets.target.wants/*udev* \\
    && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \\
    && rm -f /lib/systemd/system/basic.target.wants/* \\
    && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \\
    && ln -sf /usr/lib/systemd/systemd /sbin/init \\
    && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \\
    && systemctl mask systemd-binfmt.service \\
    && mkdir -p /etc/kubernetes/manifests \\
    && ctr oci spec \\
        | jq '.hooks.createContainer += [{{"path": "/kind/bin/mount-product-files.sh"}}]' \\
        | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]
"""


def kind_files() -> Path:
    """``images/base/files`` of the pinned kind module (downloaded by its build)."""
    gomodcache = tools.go_env("GOMODCACHE")
    files = Path(gomodcache) / f"sigs.k8s.io/kind@{tools.KIND.version}/images/base/files"
    if not files.is_dir():
        raise FileNotFoundError(f"{files} is missing: `go mod download sigs.k8s.io/kind` first")
    return files


def cache_key(release: str, mirror: str) -> str:
    inputs = {
        "release": release,
        "mirror": mirror,
        "packages": sorted(PACKAGES),
        "kind": tools.KIND.version,
        "containerd": CONTAINERD.version,
        "runc": RUNC.version,
        "crictl": tools.CRICTL.version,
        "cni": tools.CNI_PLUGINS.version,
        "dockerfile": DOCKERFILE,
        "v": 1,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _copy_files(src: Path, dest: Path) -> None:
    """kind's files with the modes its Dockerfile gives them (the module cache is read-only)."""
    shutil.copytree(src, dest)
    for path in dest.rglob("*"):
        executable = path.parent.name == "bin" and path.is_file()
        path.chmod(0o755 if path.is_dir() or executable else 0o644)


def _context(root: Path, rootfs_ref: str) -> None:
    _copy_files(kind_files(), root / "files")
    for sub in ("bin", "sbin", "cni"):
        (root / sub).mkdir()
    containerd = ensure_built(CONTAINERD)
    for name in ("containerd", "ctr", "containerd-shim-runc-v2"):
        shutil.copy2(containerd / name, root / "bin" / name)
    shutil.copy2(tools.ensure(tools.CRICTL) / "crictl", root / "bin" / "crictl")
    shutil.copy2(ensure_built(RUNC) / "runc", root / "sbin" / "runc")
    cni = tools.ensure(tools.CNI_PLUGINS)
    for name in tools.CNI_PLUGINS.names:
        shutil.copy2(cni / name, root / "cni" / name)
    (root / "Dockerfile").write_text(DOCKERFILE.format(rootfs=rootfs_ref))


def ensure_kind_base(engine: DockerEngine, log: Log) -> str:
    """kind's base image in ``engine`` (built when missing); returns its reference."""
    key = cache_key(*debian_source())
    ref = f"{REPOSITORY}:{key}"
    if engine.image_id(ref):
        return ref
    rootfs = cache_root() / "kind-base" / f"{key}.tar"
    rootfs_ref = import_rootfs(engine, f"{REPOSITORY}-rootfs:{key}", rootfs, log, packages=PACKAGES)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-kind-base-") as tmp:
        _context(Path(tmp), rootfs_ref)
        log(f"[kind-base] docker build -t {ref}")
        engine.docker("build", "--network", "none", "--tag", ref, tmp)
    return ref
