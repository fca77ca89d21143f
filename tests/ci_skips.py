"""In CI (``CI=true``) an unexpected skip fails the run: a green CI has run everything it names.

The only skips CI accepts are those of tests that need an NVIDIA GPU, which CI machines do not
have; such a test skips through :func:`skip_without_gpu`, whose reason starts with
:data:`GPU_REASON` and says what was missing. Any other skip (no root for the real nodes, a tool
that did not build, a mount refused) is turned into a failure with its reason, in the test's
report and in the summary.

Registered by ``tests/conftest.py``; outside CI it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import NoReturn

import pytest

GPU_REASON = "needs an NVIDIA GPU: "
CI_VALUES = ("true", "1", "yes")


def in_ci(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return env.get("CI", "").strip().lower() in CI_VALUES


def skip_without_gpu(why: str) -> NoReturn:
    """Skip the running test: it needs an NVIDIA GPU and ``why`` says what was missing."""
    pytest.skip(f"{GPU_REASON}{why}")


def unexpected(reason: str) -> str | None:
    """The failure text for a skip CI does not accept, or None for an accepted one."""
    if reason.startswith(GPU_REASON) and reason.removeprefix(GPU_REASON).strip():
        return None
    return (
        f"unexpected skip in CI (CI=true): {reason or '(no reason given)'}; only a test that "
        f"needs an NVIDIA GPU may skip in CI (tests/ci_skips.py)"
    )


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _fail_if_unexpected(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    failure = unexpected(_reason(report))
    if failure is not None:
        report.outcome = "failed"
        report.longrepr = failure


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if in_ci():
        _fail_if_unexpected(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if in_ci():
        _fail_if_unexpected(report)
    return report
