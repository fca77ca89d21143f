"""``python -m e2e.kind`` (``make kind-e2e``): the kind kit, run here with everything built locally.

1. kind, helm and kubectl from their Go modules (version-keyed caches, ``e2e.kind.tools``,
   ``e2e.helm``, ``e2e.binaries``);
2. a Docker engine of the kit's own (``e2e.images.docker_engine``, data root
   ``<cache>/kind-docker``);
3. the kind node image (``e2e.kind.node_image``) and the driver image (``e2e.images.driver``) in it;
4. ``e2e/kind/run.sh`` with that node image, the kit's config plus what a node image without
   kindnetd and CoreDNS needs (``local_config``), ``e2e.kind.network`` as its CNI step: cluster up,
   images loaded, chart installed twice, ``python -m e2e.suite``, cluster deleted.

Prints how long each step took (``[kind] <step>: <seconds> s``); run.sh's own lines carry the
seconds since it started. With a registry at hand, run ``e2e/kind/run.sh`` itself
(docs/development/e2e.md).
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e import binaries, helm
from e2e.images import driver as driver_image
from e2e.images.docker_engine import CLIENT, DockerEngine
from e2e.kind import tools
from e2e.kind.bounded_runc import bounding_set
from e2e.kind.node_image import ensure_node_image

KIT = Path(__file__).resolve().parent
ROOT = KIT.parent.parent
DRIVER_IMAGE = ("dra-gpu", "e2e")
CGROUP_V2_MARKER = Path("/sys/fs/cgroup/cgroup.controllers")
PROC_STATUS = Path("/proc/self/status")
# kind's nodes are privileged containers: bounded_runc.py says why runc goes through it.
RUNTIME = (
    *("--add-runtime", f"bounded-runc={KIT / 'bounded_runc.py'}"),
    "--default-runtime=bounded-runc",
)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def local_config(config: dict[str, Any], *, cgroup_v1: bool, sys_resource: bool) -> dict[str, Any]:
    """The kit's cluster config for the locally built node image and this machine.

    No kindnetd image (the kit's network step replaces it), no CoreDNS image (kubeadm's addon
    skipped); on a cgroup v1 host a kubelet that still starts there (Kubernetes >= 1.35 refuses
    cgroup v1 by default); without CAP_SYS_RESOURCE (nobody in the nodes may lower an OOM score)
    containerd clamps the kubelet's negative scores as it does rootless, or no sandbox starts."""
    local = copy.deepcopy(config)
    if not sys_resource:
        local["containerdConfigPatches"] = [
            *local.get("containerdConfigPatches", []),
            '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n',
        ]
    local.setdefault("networking", {})["disableDefaultCNI"] = True
    patches = list(local.get("kubeadmConfigPatches", []))
    patches.append("kind: InitConfiguration\nskipPhases:\n  - preflight\n  - addon/coredns\n")
    if cgroup_v1:
        patches.append("kind: KubeletConfiguration\nfailCgroupV1: false\n")
    local["kubeadmConfigPatches"] = patches
    return local


def _tool_dir(work: Path) -> Path:
    """kind, helm, kubectl and the engine's docker client, first on run.sh's PATH."""
    bin_dir = work / "bin"
    bin_dir.mkdir()
    links = {
        "kind": tools.kind_binary(),
        "helm": helm.ensure_helm(),
        "kubectl": binaries.ensure(["kubectl"])["kubectl"],
        "docker": CLIENT,
    }
    for name, target in links.items():
        (bin_dir / name).symlink_to(target)
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind", description=__doc__)
    parser.parse_args(argv)
    started = time.monotonic()

    def step(name: str, since: float) -> float:
        now = time.monotonic()
        _log(f"[kind] {name}: {now - since:.1f} s")
        return now

    with (
        tempfile.TemporaryDirectory(prefix="dra-gpu-kind-") as tmp,
        DockerEngine(binaries.cache_root() / "kind-docker", daemon_args=RUNTIME) as engine,
    ):
        work = Path(tmp)
        bin_dir = _tool_dir(work)
        mark = step("tools (kind, helm, kubectl)", started)
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "DOCKER_HOST": engine.host,
            "PYTHON": sys.executable,
            "IMAGE_REPOSITORY": DRIVER_IMAGE[0],
            "IMAGE_TAG": DRIVER_IMAGE[1],
            "BUILD_DRIVER_IMAGE": "0",
            "KEEP_CLUSTER": "0",  # the cluster lives only as long as the kit's engine
        }
        env["KIND_NODE_IMAGE"] = ensure_node_image(engine, _log)
        mark = step("node image", mark)
        config = local_config(
            yaml.safe_load((KIT / "cluster.yaml").read_text()),
            cgroup_v1=not CGROUP_V2_MARKER.exists(),
            sys_resource="CAP_SYS_RESOURCE" in bounding_set(PROC_STATUS.read_text()),
        )
        (work / "cluster.yaml").write_text(yaml.safe_dump(config))
        env["KIND_CONFIG"] = str(work / "cluster.yaml")
        env["KIND_AFTER_CREATE"] = f"{sys.executable} -m e2e.kind.network"
        driver_image.build(engine, ":".join(DRIVER_IMAGE), labels={}, log=_log)
        mark = step("driver image", mark)
        result = subprocess.run(["bash", str(KIT / "run.sh")], cwd=ROOT, env=env)
        step("run.sh (cluster up, load, install, suite, delete)", mark)
        leftover = engine.docker("ps", "-aq", "--filter", "label=io.x-k8s.kind.cluster").stdout
        if leftover.strip():
            _log(f"[kind] containers left behind: {leftover.split()}")
            return 1
        _log("[kind] no kind node container left in the engine")
    step("total", started)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
