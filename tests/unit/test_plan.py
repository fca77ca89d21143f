"""Prepare's pure planning step: claim checks and opaque config resolution.

Cases:
- every bad input gives a PlanError naming the claim and the problem (UID mismatch, not
  allocated, other driver, other node, unknown device, invalid configs, config of the wrong kind);
- configs: class before claim, later wins, other drivers skipped, request scoping (also for
  subrequests), defaults when none applies, normalized result;
- results: base request names, share IDs, one device for two requests.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from fake_claims import (
    DRIVER,
    NODE,
    claim,
    config,
    gpu_config,
    inventory,
    mig_config,
    result,
)

from dra_gpu.config import default_mig_device_config, normalized, parse_opaque_config
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare.plan import ClaimPlan, ClaimRef, PlanError, plan_claim

INVENTORY = inventory()
MIG = "gpu-1-mig-1g5gb-19-2"
REF = ClaimRef(uid=ClaimUID("uid-1"), namespace="default", name="claim-uid-1")


def plan(body: dict[str, Any]) -> ClaimPlan:
    # Test bodies, malformed ones included: typed as what the API server would send.
    return plan_claim(REF, cast(ResourceClaim, body), driver=DRIVER, pool=NODE, inventory=INVENTORY)


BAD = [
    pytest.param(
        claim("uid-2", [result("gpu-0")], name="claim-uid-1"),
        "claim default/claim-uid-1 has UID uid-2, the kubelet asked for uid-1",
        id="uid-mismatch",
    ),
    pytest.param(claim("uid-1", None), "claim default/claim-uid-1 is not allocated", id="unalloc"),
    pytest.param(
        claim("uid-1", [result("dev-0", driver="other.example.com")]),
        "has no devices of driver gpu.nvidia.com (allocated: other.example.com)",
        id="other-driver",
    ),
    pytest.param(
        claim("uid-1", [result("gpu-0", pool="node-b")]),
        "device gpu-0 is allocated from pool 'node-b', not from this node's pool 'node-a' "
        "(allocation for another node)",
        id="other-node",
    ),
    pytest.param(
        claim("uid-1", [result("gpu-9")]),
        "allocated device gpu-9 does not exist on this node",
        id="unknown-device",
    ),
    pytest.param(
        claim(
            "uid-1",
            [result("gpu-0")],
            configs=[config(gpu_config(sharing={"strategy": "MPS", "x": 1}))],
        ),
        "config[0] (FromClaim): sharing.x: unknown field",
        id="config-unknown-field",
    ),
    pytest.param(
        claim("uid-1", [result("gpu-0")], configs=[config(gpu_config(sharing={"strategy": "X"}))]),
        "sharing.strategy: must be one of 'TimeSlicing' or 'MPS', got 'X'",
        id="unknown-strategy",
    ),
    pytest.param(
        claim(
            "uid-1",
            [result("gpu-0")],
            configs=[
                config(
                    gpu_config(
                        sharing={"strategy": "MPS", "mpsConfig": {}, "timeSlicingConfig": {}}
                    )
                )
            ],
        ),
        "sharing.timeSlicingConfig: must not be set when strategy is MPS",
        id="both-subconfigs",
    ),
    # A config that names the device's request must fit it (a claim-wide one may not: below).
    pytest.param(
        claim("uid-1", [result("gpu-0")], configs=[config(mig_config(), requests=["gpu"])]),
        "a MigDeviceConfig cannot configure gpu-0, which is a full GPU (use GpuConfig",
        id="mig-config-on-gpu",
    ),
    pytest.param(
        claim(
            "uid-1",
            [result(MIG)],
            configs=[config(gpu_config(), source="FromClass", requests=["gpu"])],
        ),
        f"config[0] (FromClass): a GpuConfig cannot configure {MIG}, which is a MIG device",
        id="gpu-config-on-mig",
    ),
    pytest.param(
        claim(
            "uid-1",
            [result("gpu-0", request="g"), result(MIG, request="m")],
            configs=[config(gpu_config(), requests=["g", "m"])],
        ),
        f"config[0] (FromClaim): a GpuConfig cannot configure {MIG}, which is a MIG device",
        id="gpu-config-naming-a-mig-request",
    ),
    # Every config of this driver is checked, as the webhook does, also one that names a request
    # with no device here.
    pytest.param(
        claim(
            "uid-1",
            [result("gpu-0")],
            configs=[config(gpu_config(sharing={"strategy": "X"}), requests=["elsewhere"])],
        ),
        "config[0] (FromClaim): sharing.strategy: must be one of",
        id="invalid-config-of-another-request",
    ),
    pytest.param(
        claim(
            "uid-1",
            [result(MIG)],
            configs=[config(gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"x": 1}}))],
        ),
        "config[0] (FromClaim): sharing.mpsConfig.x: unknown field",
        id="invalid-claim-wide-config-of-the-other-kind",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_claims_fail_with_a_clear_message(body: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan(body)
    assert message in str(info.value)


def _interval(body: dict[str, Any], index: int = 0) -> str | None:
    sharing = plan(body).devices[index].cdi.config.sharing
    assert sharing is not None
    ts = getattr(sharing, "timeSlicingConfig", None)
    got: str | None = ts.interval if ts else sharing.strategy
    return got


def ts(interval: str) -> dict[str, Any]:
    return gpu_config(
        sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
    )


CONFIGS = [
    pytest.param([], "Default", id="default"),
    pytest.param([config(ts("Long"))], "Long", id="claim"),
    pytest.param(
        [config(ts("Long")), config(ts("Short"), source="FromClass")], "Long", id="claim-over-class"
    ),
    pytest.param([config(ts("Long")), config(ts("Short"))], "Short", id="later-wins"),
    pytest.param(
        [config(ts("Long")), config({"anything": True}, driver="other.example.com")],
        "Long",
        id="other-driver-skipped",
    ),
    pytest.param([config(ts("Long"), requests=["other"])], "Default", id="other-request"),
    pytest.param([config(ts("Long"), requests=["gpu"])], "Long", id="named-request"),
    pytest.param([config(gpu_config(sharing={"strategy": "MPS"}))], "MPS", id="mps-normalized"),
]


@pytest.mark.parametrize(("configs", "expected"), CONFIGS)
def test_config_resolution(configs: list[dict[str, Any]], expected: str) -> None:
    body = claim("uid-1", [result("gpu-0")], configs=configs, requests=["other"])
    assert _interval(body) == expected


TS_MIG = mig_config(sharing={"strategy": "TimeSlicing"})
MPS_MIG = mig_config(sharing={"strategy": "MPS"})
# Which config a device gets, by the kind and the requests it names: (the device's result, the
# claim's other requests, configs, what the device gets: its interval for a GPU, its strategy
# for a MIG device, or the error). A config the user wrote for a request is never dropped
# without a word: only a claim-wide one of the other kind is passed over.
FITS = [
    # The regression: a MigDeviceConfig naming a full GPU's request ran with the default.
    pytest.param(
        result("gpu-0", "gpu"),
        [],
        [config(TS_MIG, requests=["gpu"])],
        "error: config[0] (FromClaim): a MigDeviceConfig cannot configure gpu-0, which is a "
        "full GPU (use GpuConfig, or name only requests for MIG devices in this config)",
        id="mig-config-naming-a-gpu-request",
    ),
    pytest.param(
        result(MIG, "mig"),
        [],
        [config(ts("Long"), requests=["mig"])],
        f"error: config[0] (FromClaim): a GpuConfig cannot configure {MIG}, which is a MIG "
        "device (use MigDeviceConfig, or name only requests for full GPUs in this config)",
        id="gpu-config-naming-a-mig-request",
    ),
    pytest.param(
        result("gpu-0", "gpu"), [], [config(TS_MIG)], "Default", id="claim-wide-mig-config-on-gpu"
    ),
    pytest.param(
        result(MIG, "mig"), [], [config(ts("Long"))], "TimeSlicing", id="claim-wide-gpu-on-mig"
    ),
    pytest.param(
        result(MIG, "mig"), [], [config(MPS_MIG, requests=["mig"])], "MPS", id="mig-config-fits"
    ),
    # The last applicable config wins; a claim-wide one of the other kind after it is passed
    # over, one of the device's kind after it wins and the one before is no error.
    pytest.param(
        result("gpu-0", "gpu"),
        [],
        [config(ts("Long"), requests=["gpu"]), config(TS_MIG)],
        "Long",
        id="claim-wide-other-kind-after-passed-over",
    ),
    pytest.param(
        result("gpu-0", "gpu"),
        [],
        [config(TS_MIG, requests=["gpu"]), config(ts("Short"))],
        "Short",
        id="claim-wide-fitting-after-wins",
    ),
    pytest.param(
        result("gpu-0", "gpu"),
        [],
        [config(TS_MIG, source="FromClass", requests=["gpu"]), config(ts("Medium"))],
        "Medium",
        id="class-config-overridden",
    ),
    # Another request of the claim (another driver's, say): its config is not this device's.
    pytest.param(
        result("gpu-0", "gpu"),
        ["nic"],
        [config(TS_MIG, requests=["nic"])],
        "Default",
        id="other-request-of-the-claim",
    ),
    # A request the claim does not have: the API server refuses such a claim, so only one that
    # reached the driver another way has it; a misspelled name must not leave a config unused.
    pytest.param(
        result("gpu-0", "gpu"),
        [],
        [config(ts("Long"), requests=["gpus"])],
        "error: config[0] (FromClaim): names request 'gpus', which the claim does not have "
        "(its requests: gpu)",
        id="request-not-in-the-claim",
    ),
    pytest.param(
        result("gpu-0", "gpu/big"),
        [],
        [config(ts("Long"), requests=["gpu/huge"])],
        "error: config[0] (FromClaim): names request 'gpu/huge', which the claim does not have",
        id="subrequest-not-in-the-claim",
    ),
    # firstAvailable: a config naming the chosen subrequest, or its request, applies to the
    # chosen subrequest's device (and must fit it); one naming another subrequest does not.
    pytest.param(
        result("gpu-0", "gpu/big"),
        ["gpu/small"],
        [config(ts("Long"), requests=["gpu/big"])],
        "Long",
        id="chosen-subrequest",
    ),
    pytest.param(
        result("gpu-0", "gpu/big"),
        ["gpu/small"],
        [config(ts("Long"), requests=["gpu"])],
        "Long",
        id="request-of-the-chosen-subrequest",
    ),
    pytest.param(
        result("gpu-0", "gpu/big"),
        ["gpu/small"],
        [config(TS_MIG, requests=["gpu/big"])],
        "error: config[0] (FromClaim): a MigDeviceConfig cannot configure gpu-0, which is a "
        "full GPU",
        id="mig-config-naming-the-chosen-subrequest",
    ),
    pytest.param(
        result("gpu-0", "gpu/big"),
        ["gpu/small"],
        [config(TS_MIG, requests=["gpu"])],
        "error: config[0] (FromClaim): a MigDeviceConfig cannot configure gpu-0",
        id="mig-config-naming-the-request-of-the-chosen-subrequest",
    ),
    pytest.param(
        result("gpu-0", "gpu/big"),
        ["gpu/small"],
        [config(TS_MIG, requests=["gpu/small"])],
        "Default",
        id="other-subrequest",
    ),
]


@pytest.mark.parametrize(("allocated", "others", "configs", "expected"), FITS)
def test_which_config_a_device_gets(
    allocated: dict[str, Any], others: list[str], configs: list[dict[str, Any]], expected: str
) -> None:
    body = claim("uid-1", [allocated], configs=configs, requests=others)
    if expected.startswith("error: "):
        with pytest.raises(PlanError) as info:
            plan(body)
        assert f"claim default/claim-uid-1: {expected.removeprefix('error: ')}" in str(info.value)
    else:
        assert _interval(body) == expected


def test_the_claims_configs_are_read_from_its_spec_with_their_requests() -> None:
    # The 1.37.2 scheduler copies a claim's configs into the allocation without ``requests``
    # (as fake_claims does): read there, a MigDeviceConfig naming the GPU's request looked
    # claim-wide and the GPU ran with the default.
    body = claim("uid-1", [result("gpu-0")], configs=[config(TS_MIG, requests=["gpu"])])
    assert "requests" not in body["status"]["allocation"]["devices"]["config"][0]
    with pytest.raises(PlanError, match="a MigDeviceConfig cannot configure gpu-0"):
        plan(body)
    # A claim written by hand, with no spec: the allocation's configs are all there is.
    del body["spec"]
    assert _interval(body) == "Default"
    body["status"]["allocation"]["devices"]["config"] = [config(ts("Long"), requests=["gpu"])]
    assert _interval(body) == "Long"


def test_subrequest_uses_base_request_name_and_configs() -> None:
    body = claim(
        "uid-1",
        [result("gpu-0", request="gpu/big")],
        configs=[config(ts("Medium"), requests=["gpu/big"])],
    )
    planned = plan(body).devices[0]
    assert planned.requests == ("gpu",)
    assert _interval(body) == "Medium"
    body = claim(
        "uid-1",
        [result("gpu-0", request="gpu/big")],
        configs=[config(ts("Long"), requests=["gpu"])],
    )
    assert _interval(body) == "Long"


def test_claim_wide_config_of_the_other_kind_is_passed_over() -> None:
    # NVIDIA's quickstart shape: one claim with a full GPU and a MIG device and a GpuConfig with
    # no requests. The GPU gets the config, the MIG device its default; the pod runs.
    mps = gpu_config(
        sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}
    )
    body = claim(
        "uid-1", [result("gpu-0", request="g"), result(MIG, request="m")], configs=[config(mps)]
    )
    gpu, mig = plan(body).devices
    assert gpu.cdi.config == normalized(parse_opaque_config(mps))
    assert mig.cdi.config == default_mig_device_config()
    # The same with the MigDeviceConfig alone, and both: each device gets its own kind.
    mig_mps = mig_config(sharing={"strategy": "MPS"})
    body = claim(
        "uid-1",
        [result("gpu-0", request="g"), result(MIG, request="m")],
        configs=[config(mps), config(mig_mps)],
    )
    gpu, mig = plan(body).devices
    assert gpu.cdi.config == normalized(parse_opaque_config(mps))
    assert mig.cdi.config == normalized(parse_opaque_config(mig_mps))


def test_only_the_winning_config_must_fit() -> None:
    # NVIDIA's rule: the last applicable config wins and only it is checked against the device
    # type. A class's GpuConfig naming the request, overridden by the claim's MigDeviceConfig, is
    # no error; a GpuConfig listed last is.
    mig_mps = mig_config(sharing={"strategy": "MPS"})
    body = claim(
        "uid-1",
        [result(MIG, request="m")],
        configs=[
            config(gpu_config(), source="FromClass", requests=["m"]),
            config(mig_mps, requests=["m"]),
        ],
    )
    (mig,) = plan(body).devices
    assert mig.cdi.config == normalized(parse_opaque_config(mig_mps))
    body = claim(
        "uid-1",
        [result(MIG, request="m")],
        configs=[config(mig_mps, requests=["m"]), config(gpu_config(), requests=["m"])],
    )
    with pytest.raises(PlanError, match=r"config\[1\] \(FromClaim\): a GpuConfig cannot configure"):
        plan(body)


def test_mig_device_facts_and_share_id() -> None:
    planned = plan(claim("uid-1", [result(MIG, share_id="s-1", admin=True)])).devices[0]
    assert (planned.share_id, planned.admin_access, planned.pool) == ("s-1", True, NODE)
    device = planned.cdi
    assert (device.type, device.minor, device.mig_profile) == ("mig", 1, "1g.5gb")
    assert device.uuid == INVENTORY[MIG].uuid
    assert (device.gi_id, device.ci_id) is not None


def test_one_device_for_two_requests_is_prepared_once() -> None:
    body = claim("uid-1", [result("gpu-0", "a"), result("gpu-0", "b"), result(MIG, "b")])
    devices = plan(body).devices
    assert [(d.cdi.name, d.requests) for d in devices] == [
        ("gpu-0", ("a", "b")),
        (MIG, ("b",)),
    ]
