"""A Docker engine of the harness's own, to build the driver's image as users do (``docker build``).

- ``ensure_docker()`` installs Debian's ``docker.io`` when ``dockerd`` is missing (apt-get update
  first). Its package scripts must not start a system daemon (there is no systemd here, and one
  with default settings would rewrite the host's firewall): a ``policy-rc.d`` that refuses every
  service start is in place while apt runs, unless the machine already has one.
- ``DockerEngine`` runs ``dockerd`` with its own data root (in the cache, so image layers are
  reused between runs), exec root, pid file and socket: it shares nothing with a Docker the
  machine may already run. ``--iptables=false --ip6tables=false --bridge=none``: the engine only
  builds and runs build steps with no network (``--network none``); it never touches the host's
  netfilter rules, which the real nodes' pod networking and kube-proxy rely on.
- One engine per data root at a time (``e2e.locked_daemon``); ``down()`` stops it (SIGTERM, it
  stops its containers and its containerd) and is idempotent.
- An engine killed before its ``down()`` (or one that needed SIGKILL) leaves its build
  containers' shims running, with their containers, and their mounts: under the data root's
  lock, before each start and after each stop, every process whose arguments name the engine's
  exec root (the shims: ``-address <exec root>/containerd/containerd.sock``) is killed with the
  processes below it, and what is mounted under the exec root or the data root is unmounted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from e2e.binaries import cache_root
from e2e.locked_daemon import LockedDaemon
from e2e.node import cleanup as node_cleanup
from e2e.node.binaries import ensure_debian_packages

Log = Callable[[str], None]
PACKAGE = "docker.io"
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
# The daemon and client the package installs; the client found first on PATH may be another
# version, and the daemon's own is what these paths name.
DOCKERD = Path("/usr/sbin/dockerd")
CLIENT = Path("/usr/bin/docker")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_docker(log: Log = _stderr) -> None:
    """Install ``docker.io`` when its daemon is missing, without starting any service."""
    if DOCKERD.is_file() and CLIENT.is_file():
        return
    log(f"[docker] installing Debian's {PACKAGE}")
    made_policy = not POLICY_RC_D.exists()
    if made_policy:
        POLICY_RC_D.write_text("#!/bin/sh\n# dra-gpu e2e: no service starts during apt\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        ensure_debian_packages((PACKAGE,))
    finally:
        if made_policy:
            POLICY_RC_D.unlink(missing_ok=True)


def data_root() -> Path:
    return cache_root() / "docker"


class DockerEngine:
    """``dockerd`` as a child process; ``docker(...)`` runs the client against it."""

    def __init__(
        self, root: Path | None = None, *, log: Log = _stderr, daemon_args: Sequence[str] = ()
    ) -> None:
        self.root = (root or data_root()).resolve()
        self.daemon_args = tuple(daemon_args)  # more dockerd flags (the kind kit's runtime)
        # Unix socket paths are limited to 107 bytes, and containerd puts its own sockets under
        # the exec root: keep that short, under /run, named after the data root.
        tag = hashlib.sha256(str(self.root).encode()).hexdigest()[:8]
        self.exec_root = Path(f"/run/dra-gpu-docker-{tag}")
        self.socket = self.exec_root / "docker.sock"
        self._log = log
        self._daemon = LockedDaemon(
            "dockerd",
            lock_path=self.root / ".engine.lock",
            log_path=self.root / "dockerd.log",
            leftovers=self._remove_leftovers,
        )

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def up(self, *, timeout: float = 60.0) -> DockerEngine:
        ensure_docker(self._log)
        self.exec_root.mkdir(parents=True, exist_ok=True)
        argv = [
            str(DOCKERD),
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.exec_root / 'dockerd.pid'}",
            f"--host={self.host}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            *self.daemon_args,
        ]
        self._daemon.start(
            argv,
            ready=lambda: self.docker("version", check=False).returncode == 0,
            what="dockerd to answer on its socket",
            timeout=timeout,
        )
        return self

    def down(self) -> None:
        if self._daemon.running:
            self._daemon.stop(grace_s=20.0)
            # What a stopped dockerd leaves in its exec root (containerd's state, empty
            # network dirs) is of no use to the next engine.
            shutil.rmtree(self.exec_root, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        node_cleanup.kill_trees(node_cleanup.pids_with_arg(str(self.exec_root)))
        node_cleanup.unmount_under(self.exec_root)
        node_cleanup.unmount_under(self.root / "data")

    def __enter__(self) -> DockerEngine:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the client against this engine; raise with its output when it fails."""
        client = str(CLIENT) if CLIENT.is_file() else (shutil.which("docker") or "docker")
        # The classic builder: BuildKit's Dockerfile front end would be pulled from a registry
        # (the `# syntax=` line), and none is reachable here.
        env = {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}
        proc = subprocess.run([client, *args], env=env, capture_output=True, text=True)
        if check and proc.returncode != 0:
            out = f"{proc.stderr}{proc.stdout}"[-4000:]
            raise RuntimeError(f"docker {' '.join(args)} failed ({proc.returncode}):\n{out}")
        return proc

    def image_id(self, ref: str) -> str | None:
        found = self.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        return found.stdout.strip() or None if found.returncode == 0 else None

    def save(self, refs: Sequence[str], out: Path) -> Path:
        """``docker save`` of ``refs`` into a docker-archive tarball (what ``ctr`` imports)."""
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        self.docker("save", "--output", str(tmp), *refs)
        tmp.replace(out)
        return out
