"""Cluster-tier wiring: tools some tests build on first use are built before any test runs.

A cold build of helm or of the reference CDI validator from the Go module proxy takes minutes;
done here, right after collection and only when a selected test needs it, it is not counted
against any test's timeout (pytest-timeout's clock includes what a test builds itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from collection_output import terminal_log

from e2e import cdi_validator, helm


def _helm() -> None:
    helm.ensure_helm()


def _cdi_validator() -> None:
    with contextlib.suppress(cdi_validator.ValidatorUnavailable):  # its test fails, saying why
        cdi_validator.ensure()


# Test module -> what it builds on first use (each returns at once when already built).
BUILDS: dict[str, Callable[[], None]] = {
    "test_manifests.py": _helm,
    "test_kind_releases.py": _helm,
    "test_demo.py": _helm,
    "test_webhook_configuration.py": _helm,
    "test_controller.py": _helm,
    "test_webhook_outage.py": _helm,
    "test_prepare.py": _cdi_validator,
}


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    todo = dict.fromkeys(BUILDS[i.path.name] for i in session.items if i.path.name in BUILDS)
    if todo:
        with terminal_log(session):
            for build in todo:
                build()
