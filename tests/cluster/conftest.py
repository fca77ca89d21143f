"""Cluster-tier wiring: helm is built before the tests that render the chart run.

A cold build of helm from the Go module proxy takes minutes; done here, right after collection
and only when a selected test renders the chart, it is not counted against any test's timeout.
"""

from __future__ import annotations

import pytest
from collection_output import terminal_log

from e2e import helm

NEEDS_HELM = ("test_manifests.py", "test_controller.py", "test_webhook_outage.py")


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or helm.helm_path().is_file():
        return
    if not any(item.path.name in NEEDS_HELM for item in session.items):
        return
    with terminal_log(session):
        helm.ensure_helm()
