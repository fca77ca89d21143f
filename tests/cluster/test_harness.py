"""The harness itself: restarts keep the cluster's identity, and nothing outlives a teardown.

Cases (each runs its own control plane, apart from the session's):
- stop_apiserver makes the API unreachable; start_apiserver brings it back on the same address with
  the same certificates (the old kubeconfig works); down() leaves no process behind;
- a component that fails to start: up() raises with that component's log, nothing is left running;
- the components die with the Python process that started them, by SIGTERM or even SIGKILL;
- ``python -m e2e.cluster up`` prints ``export KUBECONFIG=...`` last, the kubeconfig reaches the
  cluster, ``env`` prints the same line, ``down`` stops it and leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import binaries, procs, waiting
from e2e.cluster import Cluster, ClusterError

ROOT = Path(__file__).resolve().parents[2]


def test_apiserver_restart_keeps_identity_and_down_leaves_nothing() -> None:
    cluster = Cluster()
    try:
        cluster.up()
        assert "ok" in cluster.kubectl("get", "--raw", "/readyz")
        kubeconfig_before = cluster.kubeconfig.read_bytes()

        cluster.stop_apiserver()
        with pytest.raises(ClusterError, match=r"connect|refused"):
            cluster.kubectl("get", "--raw", "/readyz", "--request-timeout=3s")

        cluster.start_apiserver()
        assert cluster.kubeconfig.read_bytes() == kubeconfig_before
        assert "ok" in cluster.kubectl("get", "--raw", "/readyz")
        node = cluster.register_node("restart-check")
        assert node["metadata"]["name"] == "restart-check"
    finally:
        cluster.down()
    assert procs.leftover_processes(cluster.workdir) == []
    assert not cluster.workdir.exists()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "e2e.cluster", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_up_env_down(tmp_path: Path) -> None:
    env = {**os.environ, "DRA_GPU_CLUSTER_STATE": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    up = _cli("up", env=env)
    try:
        assert up.returncode == 0, up.stderr
        last = up.stdout.strip().splitlines()[-1]
        assert last.startswith("export KUBECONFIG=")
        kubeconfig = last.removeprefix("export KUBECONFIG=")
        workdir = Path(kubeconfig).parent
        kubectl = binaries.binary_path("kubectl")
        namespaces = subprocess.run(
            [
                str(kubectl),
                f"--kubeconfig={kubeconfig}",
                "get",
                "namespace",
                "default",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert namespaces.stdout.strip() == "namespace/default"
        assert _cli("env", env=env).stdout.strip() == last
        assert procs.leftover_processes(workdir) != []  # the components run detached
    finally:
        down = _cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert procs.leftover_processes(workdir) == []
    assert not workdir.exists()
    assert _cli("env", env=env).returncode == 1


def test_failed_start_reports_component_log_and_leaves_nothing() -> None:
    cluster = Cluster(extra_args={"kube-apiserver": ["--no-such-flag=1"]})
    try:
        with pytest.raises(ClusterError) as err:
            cluster.up()
        message = str(err.value)
        assert "kube-apiserver exited (code 1) before it became healthy" in message
        assert "unknown flag: --no-such-flag" in message  # the component's own log, shown
        assert procs.leftover_processes(cluster.workdir) == []
        assert (cluster.workdir / "logs" / "kube-apiserver.log").is_file()  # kept to inspect
    finally:
        cluster.down()


_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from e2e.cluster import Cluster
c = Cluster().up()
print(c.workdir, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_components_die_with_the_python_process(sig: signal.Signals) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(root=str(ROOT))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    workdir = Path("/nonexistent")
    try:
        assert holder.stdout is not None
        workdir = Path(holder.stdout.readline().strip())
        assert len(procs.leftover_processes(workdir)) == 4  # etcd + 3 Kubernetes components
        holder.send_signal(sig)
        holder.wait(timeout=30)
        with contextlib.suppress(waiting.WaitTimeout):  # the assert below names what is left
            waiting.wait_for(
                "the components to exit",
                lambda: not procs.leftover_processes(workdir),
                timeout=15,
                every=0.2,
            )
        assert procs.leftover_processes(workdir) == []
    finally:
        holder.kill()
        holder.wait()
        for pid, _ in procs.leftover_processes(workdir):  # never leak, even when failing
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)
