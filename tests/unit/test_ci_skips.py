"""tests/ci_skips.py: with ``CI=true`` an unexpected skip fails the pytest run (the node tier
without root, a tool that did not build); a test that needs an NVIDIA GPU may skip, saying why;
outside CI a skip stays a skip."""

from __future__ import annotations

import pytest
from ci_skips import GPU_REASON, in_ci, unexpected

TESTS = """
import pytest
from ci_skips import skip_without_gpu

def test_runs():
    pass

def test_needs_root():
    pytest.skip("a real node (containerd, runc, kubelet, cgroups, mounts) needs root")

@pytest.fixture(scope="session")
def real_nodes():
    pytest.skip("a real node needs root")

def test_on_a_node(real_nodes):
    pass

def test_on_a_gpu():
    skip_without_gpu("NVML not usable here: NVML Shared Library Not Found")

@pytest.mark.xfail(reason="known")
def test_known_bug():
    assert False
"""

NODE_TIER_MODULE = """
import pytest
pytest.skip("this module needs root", allow_module_level=True)
"""


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, module: str
) -> pytest.RunResult:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    path = pytester.makepyfile(module)
    # ci_skips is imported already (by tests/conftest.py): nothing to rewrite, say nothing.
    quiet = "ignore::pytest.PytestAssertRewriteWarning"
    return pytester.runpytest(
        str(path), "-p", "ci_skips", "-p", "no:cacheprovider", "-rfEs", "-W", quiet
    )


def test_in_ci_a_skip_without_a_gpu_reason_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", TESTS)
    result.assert_outcomes(passed=1, failed=1, errors=1, skipped=1, xfailed=1)  # errors: setup
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*test_needs_root*unexpected skip in CI (CI=true): a real node (containerd*needs root*",
            "*test_on_a_node*unexpected skip in CI*a real node needs root*",
            f"SKIPPED*{GPU_REASON}NVML not usable here*",
        ],
        consecutive=False,
    )


def test_in_ci_a_module_skipped_at_collection_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", NODE_TIER_MODULE)
    result.assert_outcomes(errors=1)
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*unexpected skip in CI*this module needs root*"])


def test_outside_ci_a_skip_stays_a_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, None, TESTS)
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    run(pytester, monkeypatch, "false", NODE_TIER_MODULE).assert_outcomes(skipped=1)


@pytest.mark.parametrize(
    ("reason", "accepted"),
    [
        (f"{GPU_REASON}NVML not usable here: no driver", True),
        (GPU_REASON, False),  # a GPU skip must say what was missing
        ("reference CDI validator not available: go build failed", False),
        ("needs root to mount a small tmpfs as a full disk", False),
        ("", False),
    ],
)
def test_only_a_gpu_skip_with_its_reason_is_accepted(reason: str, accepted: bool) -> None:
    assert (unexpected(reason) is None) == accepted


def test_ci_is_read_from_the_environment() -> None:
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"})
    assert not in_ci({}) and not in_ci({"CI": "false"})
