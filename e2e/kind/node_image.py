"""A kind node image built here: kind's base image plus the Kubernetes the harness builds.

Why not ``kind build node-image --type file``: kind side-loads only the four images of a
kubernetes-server tarball (apiserver, controller-manager, scheduler, proxy) and fetches every other
image it preloads (etcd, pause, kindnetd, local-path-provisioner) with ``ctr content fetch`` from
their registries, with no way to hand it local archives; here no registry answers. So this module
does what kind's ``buildImage`` does, step for step, with local archives for all of them:

1. a container of the base image (``e2e.kind.base_image``), no network;
2. ``kubeadm``, ``kubelet``, ``kubectl`` copied to ``/usr/bin``, the version into ``/kind/version``;
3. containerd started inside it, each image archive imported as kind does
   (``ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned --no-unpack``):
   - kube-apiserver, kube-controller-manager, kube-scheduler and etcd as one-layer images of their
     static binaries (``e2e.images``), under the names ``kubeadm config images list`` gives; etcd
     is the harness's etcd (its version, whatever tag kubeadm asks for);
   - kube-proxy on the base image (it needs iptables, conntrack and nft);
   - the pause image (``e2e.images``) under containerd's sandbox image name;
4. ``docker commit`` with kind's entrypoint.

Left out: CoreDNS (nothing in the suite resolves names; the kit's cluster config skips kubeadm's
CoreDNS addon) and kindnetd (``e2e.kind.network`` is the kit's CNI for these images).

Cached: the image ``localhost/dra-gpu/kind-node:<k8s version>-<key>`` stays in the engine's data
root (under the cache); the key covers the base image, the Kubernetes and etcd versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

from e2e import binaries
from e2e.images import node_images as images
from e2e.images.docker_engine import DockerEngine, Log
from e2e.kind.base_image import ensure_kind_base

REPOSITORY = "localhost/dra-gpu/kind-node"
NODE_BINARIES = ("kubeadm", "kubelet", "kubectl")
STATIC_IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
IMPORT = (
    *("ctr", "--namespace=k8s.io", "images", "import"),
    *("--label=io.cri-containerd.pinned=pinned", "--all-platforms", "--no-unpack", "--digests"),
)
WAIT_CONTAINERD = (
    "for i in $(seq 100); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.1; done;"
    " ctr info >/dev/null"
)
V = 1  # bump when the recipe changes


def component_image(images_list: list[str], component: str) -> str:
    """The name ``kubeadm config images list`` gives ``component`` (e.g. registry.k8s.io/etcd:…)."""
    for name in images_list:
        if name.rsplit("/", 1)[-1].split(":", 1)[0] == component:
            return name
    raise ValueError(f"kubeadm lists no {component} image: {images_list}")


def sandbox_image(containerd_config: str) -> str:
    match = re.search(r'^\s*sandbox_image\s*=\s*"([^"]+)"', containerd_config, re.MULTILINE)
    if match is None:
        raise ValueError(f"no sandbox_image in {CONTAINERD_CONFIG}")
    return match.group(1)


def static_image(name: str, binary: Path) -> images.ImageSpec:
    """One layer: the static ``binary`` in /usr/local/bin (what kubeadm's manifests run by name)."""
    entries = [
        images.Entry(d, "dir", mode=0o1777 if d == "tmp" else 0o755)
        for d in ("tmp", "usr", "usr/local", "usr/local/bin")
    ]
    entries.append(
        images.Entry(f"usr/local/bin/{binary.name}", "file", data=binary.read_bytes(), mode=0o755)
    )
    return images.ImageSpec(
        name=name,
        entries=tuple(entries),
        entrypoint=(f"/usr/local/bin/{binary.name}",),
        env=("PATH=/usr/local/bin:/usr/bin:/bin",),
    )


def cache_key(base: str, versions: binaries.Versions) -> str:
    inputs = f"{base}|{versions.k8s}|{versions.etcd}|{V}"
    return hashlib.sha256(inputs.encode()).hexdigest()[:12]


def _kubeadm_images(kubeadm: Path, version: str) -> list[str]:
    argv = [str(kubeadm), "config", "images", "list", "--kubernetes-version", version]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()


def _archives(
    engine: DockerEngine, base: str, paths: dict[str, Path], sandbox: str, out: Path
) -> list[Path]:
    """Every image the node preloads, as docker archives in ``out``."""
    listed = _kubeadm_images(paths["kubeadm"], binaries.Versions.from_env().k8s)
    archives: list[Path] = []
    for component in STATIC_IMAGES:
        archive = out / f"{component}.tar"
        images.write_archive(
            archive, static_image(component_image(listed, component), paths[component])
        )
        archives.append(archive)
    pause = images.pause_spec(images.build_pause(images.cache_dir() / "pause"))
    archive = out / "pause.tar"
    images.write_archive(archive, dataclasses.replace(pause, name=sandbox))
    archives.append(archive)
    proxy = component_image(listed, "kube-proxy")
    context = out / "kube-proxy"
    context.mkdir()
    os.link(paths["kube-proxy"], context / "kube-proxy")
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY kube-proxy /usr/local/bin/kube-proxy\n"
        'ENTRYPOINT ["/usr/local/bin/kube-proxy"]\n'
    )
    engine.docker("build", "--network", "none", "--tag", proxy, str(context))
    archives.append(engine.save([proxy], out / "kube-proxy.tar"))
    engine.docker("image", "rm", proxy)  # in the node image now; the engine needs no copy
    return archives


def ensure_node_image(engine: DockerEngine, log: Log) -> str:
    """The kind node image of the harness's Kubernetes in ``engine``; returns its reference."""
    versions = binaries.Versions.from_env()
    base = ensure_kind_base(engine, log)
    ref = f"{REPOSITORY}:{versions.k8s}-{cache_key(base, versions)}"
    if engine.image_id(ref):
        return ref
    paths = binaries.ensure((*NODE_BINARIES, *STATIC_IMAGES[:3], "kube-proxy", "etcd"))
    name = f"dra-gpu-kind-build-{os.getpid()}"
    engine.docker("rm", "-f", "-v", name, check=False)
    log(f"[kind-node] building {ref} from {base}")
    engine.docker(
        *("run", "-d", "--entrypoint=sleep", f"--name={name}", "--network=none"),
        *("--security-opt", "seccomp=unconfined", base, "infinity"),
    )
    try:
        for binary in NODE_BINARIES:
            engine.docker("cp", str(paths[binary]), f"{name}:/usr/bin/{binary}")
        engine.docker("exec", name, "sh", "-c", f"printf %s {versions.k8s} > /kind/version")
        config = engine.docker("exec", name, "cat", CONTAINERD_CONFIG).stdout
        with tempfile.TemporaryDirectory(prefix="dra-gpu-kind-node-") as tmp:
            archives = _archives(engine, base, paths, sandbox_image(config), Path(tmp))
            engine.docker("exec", name, "mkdir", "-p", "/kind/images")
            for archive in archives:
                engine.docker("cp", str(archive), f"{name}:/kind/images/{archive.name}")
        engine.docker("exec", "-d", name, "containerd")
        engine.docker("exec", name, "bash", "-c", WAIT_CONTAINERD)
        for archive in archives:
            engine.docker("exec", name, *IMPORT, f"/kind/images/{archive.name}")
        imported = engine.docker("exec", name, "ctr", "-n", "k8s.io", "images", "ls", "-q")
        named = sorted(n for n in imported.stdout.split() if n.startswith("registry."))
        log(f"[kind-node] preloaded: {' '.join(named)}")
        engine.docker("exec", name, "bash", "-c", "pkill containerd; rm -rf /kind/images")
        engine.docker("exec", name, "bash", "-c", "while pgrep -x containerd; do sleep 0.2; done")
        engine.docker(
            "commit",
            "--change",
            'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]',
            name,
            ref,
        )
    finally:
        engine.docker("rm", "-f", "-v", name, check=False)
    log(f"[kind-node] built {ref}")
    return ref
