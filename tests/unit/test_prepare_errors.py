"""How prepare reports a failure: to the kubelet (the claim's error) and in the plugin's log.

Cases:
- bad input (an invalid config, a quantity with a huge exponent, a config of the wrong kind, a
  device that is gone) is the user's to fix: the claim's error names the field, says nothing of
  an "internal error", and the log has one WARNING line per claim without a traceback;
- a claim too deeply nested for Python's JSON decoder (the API server takes deeper) is the same;
- a true internal error (a bug, here a fetcher that raises) keeps its traceback at ERROR.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from fake_claims import (
    FakeFetcher,
    claim,
    config,
    device_state,
    gpu_config,
    inventory,
    mig_config,
    result,
)

from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import claims
from dra_gpu.prepare.plan import ClaimRef

REF = ClaimRef(uid=ClaimUID("bad"), namespace="default", name="claim-bad")


def mps_limit(limit: object) -> dict[str, Any]:
    return gpu_config(
        sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}}
    )


USER_ERRORS = [
    pytest.param(
        [config(mps_limit("1e9999999999"))],
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at most",
        id="huge-exponent",
    ),
    pytest.param(
        [config(mps_limit("-1Gi"))],
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must not be negative",
        id="negative",
    ),
    pytest.param(
        [config(mps_limit("x" * 5000))],
        "defaultPinnedDeviceMemoryLimit: 'xxxx",
        id="long-value",
    ),
    pytest.param(
        [config(mig_config(), requests=["gpu"])],
        "config[0] (FromClaim): a MigDeviceConfig cannot configure gpu-0",
        id="wrong-kind",
    ),
    pytest.param(
        [config({"apiVersion": "resource.nvidia.com/v1beta1"})],
        "config[0] (FromClaim): kind: required field is missing",
        id="no-kind",
    ),
]


@pytest.mark.parametrize(("configs", "message"), USER_ERRORS)
def test_bad_input_is_a_warning_naming_the_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, configs: list[Any], message: str
) -> None:
    fetcher = FakeFetcher(claim("bad", [result("gpu-0")], name="claim-bad", configs=configs))
    state = device_state(tmp_path, devices=inventory(), claims=fetcher)
    with caplog.at_level(logging.INFO):
        error = state.prepare([REF])[REF.uid].error
    assert message in error
    assert "internal error" not in error
    assert len(error) < 400, error
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in failures] == [("WARNING", None)]
    assert message in failures[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class _BrokenFetcher(FakeFetcher):
    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        raise RuntimeError("a bug")


def test_an_internal_error_keeps_its_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = device_state(tmp_path, devices=inventory(), claims=_BrokenFetcher())
    error = state.prepare([REF])[REF.uid].error
    assert "internal error: RuntimeError: a bug" in error
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.exc_info is not None


class _DeepJsonClient:
    """Answers the claim GET the way KubeClient does: json.loads of the server's body."""

    def request(self, method: str, path: str) -> Any:
        # 10 KiB of parameters nested 5,000 deep: the API server takes it (its limit is 10,000).
        return json.loads('{"spec": {"p": ' + "[" * 5000 + "]" * 5000 + "}}")


def test_a_claim_too_deep_to_decode_is_a_warning_not_an_internal_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fetcher = claims.KubeClaimFetcher(_DeepJsonClient())  # type: ignore[arg-type]
    state = device_state(tmp_path, devices=inventory(), claims=fetcher)  # type: ignore[arg-type]
    error = state.prepare([REF])[REF.uid].error
    assert "claim default/claim-bad cannot be read: it is nested too deeply" in error
    assert "internal error" not in error
    assert [r.levelname for r in caplog.records if "failed" in r.getMessage()] == ["WARNING"]
