"""Shared pytest wiring: tiers by directory, and the session's local control plane.

- Everything under ``tests/cluster/`` is marked ``cluster`` and everything under ``tests/node/`` is
  marked ``node``, so ``-m "not cluster and not node"`` selects the unit tier.
- A unit test may not use the ``cluster`` fixture (collection fails with a clear message): the unit
  tier never starts processes.
- In CI (``CI=true``) an unexpected skip fails the run (``tests/ci_skips.py``): only a test
  that needs an NVIDIA GPU may skip there.
- Missing binaries are built once, right after collection and only when a selected test needs
  them (the kubelet only for node tests), so a cold build is not counted against a test's timeout.
- The ``cluster`` fixture is one control plane per session (``cluster_api``: an admin API
  client for it). If any test failed, the components' log tails are shown in the summary and the
  work directory is kept; after the session, any process still mentioning a harness work
  directory fails the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

# First: sets GRPC_ENABLE_FORK_SUPPORT=false before any test imports grpc (dra_gpu/__init__.py).
import dra_gpu  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `e2e` is not an installed package; make it importable
    sys.path.insert(0, str(ROOT))

import ci_skips  # noqa: E402
from collection_output import terminal_log  # noqa: E402

from e2e import binaries, procs  # noqa: E402
from e2e.cluster import Cluster  # noqa: E402
from e2e.cluster.components import gates_from  # noqa: E402

TESTS = Path(__file__).resolve().parent
TIER_MARKERS = {"cluster": "cluster", "node": "node"}  # tests/<dir>/ -> marker
_harness_workdirs: list[Path] = []
_failure_logs: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    # CI=true: an unexpected skip fails the run (only tests that need an NVIDIA GPU may skip).
    config.pluginmanager.register(ci_skips, "ci_skips")
    config.pluginmanager.import_plugin("pytester")  # tests/unit/test_ci_skips.py runs pytest


def _tier(item: pytest.Item) -> str | None:
    try:
        return item.path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier(item)
        if tier in TIER_MARKERS:
            item.add_marker(getattr(pytest.mark, TIER_MARKERS[tier]))
        elif tier == "unit" and "cluster" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid}: unit tests must not use the cluster fixture")


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    wanted: list[str] = []
    if any(i.get_closest_marker(m) for i in session.items for m in TIER_MARKERS.values()):
        wanted += binaries.CONTROL_PLANE
    if any(i.get_closest_marker("node") for i in session.items):
        wanted += binaries.K8S_CGO  # the kubelet
    if not binaries.missing(wanted, binaries.Versions.from_env()):
        return
    with terminal_log(session) as log:
        log(f"building Kubernetes binaries (first run only): {', '.join(wanted)}")
        binaries.ensure(wanted, log=log)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path: an MPS daemon's sockets below a state dir in it fit
    a socket path's 107 bytes, as on a node (pytest's ``tmp_path`` is too long for that)."""
    path = Path(tempfile.mkdtemp(prefix="dg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A running local control plane (etcd, API server, controller-manager, scheduler), with
    the feature gates of ``DRA_GPU_FEATURE_GATES`` (``A=false,B=true``) where it is set."""
    instance = Cluster(feature_gates=gates_from(os.environ.get("DRA_GPU_FEATURE_GATES")))
    _harness_workdirs.append(instance.workdir)
    instance.up()
    yield instance
    failed = request.session.testsfailed > 0
    if failed:
        _failure_logs.append(instance.logs())
    instance.down(remove_workdir=not failed)


@pytest.fixture(scope="session")
def cluster_api(cluster: Cluster) -> Iterator[ApiClient]:
    """A ``kubernetes.client.ApiClient`` with the admin identity for the session's cluster."""
    with cluster.api_client() as api:
        yield api


@pytest.hookimpl(trylast=True)  # after session fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    left = [p for w in _harness_workdirs for p in procs.leftover_processes(w)]
    if left:
        procs_text = "\n".join(f"  {pid}: {cmd[:160]}" for pid, cmd in left)
        _failure_logs.append(f"harness processes left after the session:\n{procs_text}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for pid, _ in left:  # reported and failed; still, nothing outlives the run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for text in _failure_logs:
        terminalreporter.section("local control plane", sep="-")
        terminalreporter.write_line(text)
