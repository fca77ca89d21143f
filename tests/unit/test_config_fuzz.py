"""Fuzzing of opaque configs (hypothesis): the admission webhook and prepare judge every input
alike, neither crashes, and every refusal names the field it refuses.

Inputs: configs close to valid ones (each field drawn from valid values, near misses such as
``"1Gi\\n"``, ``-1Gi``, ``1e999999``, keys with newlines, unknown fields, values of the wrong
type, very long strings, lists nested thousands of levels deep) and arbitrary JSON, at the top
and in place of any field.

Properties, for every input ``parameters``:
- the webhook (:func:`admission.review` of a ResourceClaim carrying it) allows it exactly when
  prepare (:func:`plan.plan_claim` of a claim holding a full GPU and a MIG device, with the config
  for the whole claim, then the CDI spec) succeeds;
- prepare raises nothing but :class:`PlanError`, and the webhook never raises;
- every problem names a field (a path into ``parameters``) and stays short, however long the
  input; a message of prepare holds at most 21 problem lines;
- what prepare accepts puts no newline or NUL into the container environment.

Budget: ``make test`` runs :data:`EXAMPLES` (200) examples per property, about 3 s of CPU.
A longer run on demand::

    DRA_GPU_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/unit/test_config_fuzz.py

(hypothesis keeps failing examples in ``.hypothesis/`` and replays them first.)
"""

from __future__ import annotations

import os
from typing import Any, Final, cast

from fake_claims import DRIVER, NODE, claim, config, inventory, result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gpu.config import ConfigError, parse_opaque_config
from dra_gpu.controller import admission
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import cdi
from dra_gpu.prepare.plan import ClaimRef, PlanError, plan_claim

EXAMPLES: Final = int(os.environ.get("DRA_GPU_FUZZ_EXAMPLES", "200"))
FUZZ: Final = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INVENTORY = inventory()
MIG = "gpu-1-mig-1g5gb-19-2"
REF = ClaimRef(uid=ClaimUID("uid-1"), namespace="default", name="claim-uid-1")
PREFIX = "spec.devices.config[0].opaque.parameters"
API = "resource.nvidia.com/v1beta1"

# --- inputs ------------------------------------------------------------------------------------


def nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


LONG = st.integers(min_value=65, max_value=6000).map(lambda n: "x" * n)
TEXT = st.one_of(st.text(max_size=20), LONG, st.sampled_from(["", "\n", "0\n", "GPU-\n", "\x00"]))
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**4000, -(10**4000)]),  # json.loads refuses over 4300 digits
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
    st.integers(min_value=900, max_value=5000).map(nested),  # deep: repr() of it fails
)
ANY_JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)

QUANTITY_TEXT = st.one_of(
    st.from_regex(
        r"\A[+-]?[0-9]{0,22}(\.[0-9]{0,4})?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,12})?"
        r"\n?\Z"
    ),
    st.sampled_from(["1Gi", "1Mi", "512Ki", "0", "-1Gi", "1e999999", "8Ei", "1Gi\n", " 1Gi"]),
)
QUANTITY = st.one_of(QUANTITY_TEXT, st.integers(min_value=-(2**64), max_value=2**64), JSON_LEAF)
DEVICE_KEY = st.one_of(
    st.from_regex(r"\A[0-9]{1,3}\n?\Z"),
    st.from_regex(r"\A(GPU|MIG)-[A-Za-z0-9/-]{1,40}\n?\Z"),
    TEXT,
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: mostly from ``value``, sometimes any JSON."""
    return st.one_of(value, value, value, ANY_JSON)


def fields(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    """An object of these fields, sometimes with an unknown one, sometimes any JSON instead."""
    known = st.fixed_dictionaries(required, optional=optional)
    extra = st.dictionaries(st.one_of(st.text(max_size=10), LONG), ANY_JSON, max_size=2)
    with_extra = st.tuples(known, extra).map(lambda t: {**t[1], **t[0]})
    return st.one_of(known, known, known, with_extra, ANY_JSON)


MPS_CONFIG = fields(
    {},
    {
        "defaultActiveThreadPercentage": maybe(st.integers(min_value=-5, max_value=105)),
        "defaultPinnedDeviceMemoryLimit": QUANTITY,
        "defaultPerDevicePinnedMemoryLimit": maybe(
            st.dictionaries(DEVICE_KEY, QUANTITY, max_size=3)
        ),
    },
)
STRATEGY = maybe(st.sampled_from(["TimeSlicing", "MPS", "Fractional", "mps"]))
TIME_SLICING = fields(
    {}, {"interval": maybe(st.sampled_from(["Default", "Short", "Medium", "Long", "Huge"]))}
)
SHARING = fields(
    {"strategy": STRATEGY}, {"timeSlicingConfig": TIME_SLICING, "mpsConfig": MPS_CONFIG}
)
# Valid configs, so that acceptance is tested as often as refusal.
VALID_QUANTITY = st.one_of(
    st.integers(min_value=2**20, max_value=2**63 - 1),
    st.from_regex(r"\A[1-9][0-9]{0,3}(Mi|Gi|Ti|G|M)\Z").filter(lambda q: q not in {"1M"}),
)
VALID_MPS = st.fixed_dictionaries(
    {},
    optional={
        "defaultActiveThreadPercentage": st.integers(min_value=0, max_value=100),
        "defaultPinnedDeviceMemoryLimit": VALID_QUANTITY,
        "defaultPerDevicePinnedMemoryLimit": st.dictionaries(
            st.from_regex(r"\A([0-9]{1,2}|GPU-[a-f0-9-]{1,36})\Z"), VALID_QUANTITY, max_size=3
        ),
    },
)
INTERVAL = st.sampled_from(["Default", "Short", "Medium", "Long"])
VALID_SHARING = st.one_of(
    st.fixed_dictionaries(
        {"strategy": st.just("TimeSlicing")},
        optional={"timeSlicingConfig": st.fixed_dictionaries({}, optional={"interval": INTERVAL})},
    ),
    st.fixed_dictionaries({"strategy": st.just("MPS")}, optional={"mpsConfig": VALID_MPS}),
)
VALID_PARAMETERS = st.fixed_dictionaries(
    {"apiVersion": st.just(API), "kind": st.sampled_from(["GpuConfig", "MigDeviceConfig"])},
    optional={"sharing": VALID_SHARING},
).map(
    # A MigDeviceConfig has no timeSlicingConfig.
    lambda p: (
        p
        if p["kind"] == "GpuConfig" or "timeSlicingConfig" not in p.get("sharing", {})
        else {**p, "sharing": {"strategy": "TimeSlicing"}}
    )
)

PARAMETERS = st.one_of(
    VALID_PARAMETERS,
    fields(
        {
            "apiVersion": maybe(
                st.sampled_from([API, API, API, "resource.nvidia.com/v1", API + "\n"])
            ),
            "kind": maybe(
                st.sampled_from(["GpuConfig", "MigDeviceConfig", "GpuConfig\n", "TpuConfig"])
            ),
        },
        {"sharing": SHARING},
    ),
    ANY_JSON,
)

# --- the two judges -------------------------------------------------------------------------


def webhook(parameters: Any) -> list[str]:
    """The webhook's problems with a ResourceClaim carrying ``parameters``; [] when allowed."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "object": {
                "spec": {
                    "devices": {
                        "config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}]
                    }
                }
            },
        },
    }
    response = admission.review(review)["response"]
    if response["allowed"]:
        return []
    problems = response["status"]["message"].split("; ")
    assert problems and all(problems)
    return list(problems)


def prepare(parameters: Any) -> tuple[str | None, list[str]]:
    """Prepare's error (None when prepared) and the container environment it would set."""
    body = claim(
        "uid-1",
        [result("gpu-0", request="g"), result(MIG, request="m")],
        configs=[config(parameters)],
    )
    try:
        claim_json = cast(ResourceClaim, body)  # a test literal, typed as the API's JSON
        planned = plan_claim(REF, claim_json, driver=DRIVER, pool=NODE, inventory=INVENTORY)
        devices = [d.cdi for d in planned.devices]
        spec = cdi.build_spec(
            claim_uid=REF.uid, claim_ref=str(REF), devices=devices, node=cdi.SimulatedNode()
        )
    except (PlanError, cdi.CDIError) as exc:
        return str(exc), []
    env = [e for device in spec["devices"] for e in device["containerEdits"].get("env", [])]
    return None, env


# --- properties -------------------------------------------------------------------------------


@FUZZ
@given(PARAMETERS)
def test_webhook_and_prepare_agree_and_never_crash(parameters: Any) -> None:
    refused = webhook(parameters)
    error, env = prepare(parameters)
    assert (error is None) == (not refused), (refused, error)
    for problem in refused:
        assert problem.startswith(PREFIX), problem  # names the field, by its path in the claim
        assert len(problem) < 400, problem
    if error is not None:
        assert "internal error" not in error
        assert error.startswith("claim default/claim-uid-1: config[0] (FromClaim): "), error
        assert len(error) < 22 * 400, error
    for entry in env:
        assert "\n" not in entry and "\x00" not in entry, entry


@FUZZ
@given(PARAMETERS)
def test_every_problem_names_a_field(parameters: Any) -> None:
    try:
        parse_opaque_config(parameters)
    except ConfigError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.path or problem.reason.startswith("parameters must be an object")
            assert len(str(problem)) < 300, str(problem)
