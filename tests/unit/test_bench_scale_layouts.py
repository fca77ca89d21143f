"""bench/scale_layouts.py: the scale benchmark's layouts and figure arithmetic.

Cases:
- each layout's workload claim selects an attribute its devices publish, with the value they
  publish, and as many devices per node as the layout says (a selector that matched nothing
  would leave every pod unscheduled and the run measuring nothing);
- ``minimal`` publishes the same device names as ``static`` with only ``type``;
- ``no-versions`` publishes ``static``'s devices less exactly the three version attributes;
- ``dynamic-mig`` consumes counters published in the same pool;
- ``dynamic-mig-bound-small`` publishes exactly ``dynamic-mig-bound``'s devices of its first
  GPU, with its binding conditions, and its binder makes MIG devices of those;
- ``consumable`` publishes shareable H200s and its claim asks for a 40Gi share, so that as many
  claims fit a node as the layout says;
- unknown layouts are refused by name;
- request counters: deltas per key, scaled per node per minute;
- ``--repeat``: rounds alternate their order, each run has its own namespace, and a layout's
  figure is its median round's (a round without a figure does not count), and its ratio to
  the control is given round by round.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from bench import scale_layouts as sl
from dra_gpu import DRIVER_NAME

NODE, UID = "kwok-00007", "6c6f7a8e-0000-4000-8000-000000000007"


def devices(layout: sl.Layout) -> list[dict[str, Any]]:
    return [d for s in layout.render(NODE, UID) for d in s["spec"].get("devices") or []]


def matching(layout: sl.Layout) -> list[str]:
    """Devices whose attribute equals what the claim's one selector compares it with."""
    found = re.fullmatch(
        rf"device\.attributes\['{re.escape(DRIVER_NAME)}'\]\.(\w+) == '([^']+)'", layout.selector
    )
    assert found, layout.selector
    name, value = found.groups()
    return [d["name"] for d in devices(layout) if d["attributes"].get(name) == {"string": value}]


@pytest.mark.parametrize(
    "name",
    [
        "static",
        "minimal",
        "mig",
        "dynamic-mig",
        "dynamic-mig-bound",
        "dynamic-mig-bound-small",
        "no-versions",
    ],
)
def test_the_claim_selects_the_devices_the_layout_counts_on(name: str) -> None:
    (layout,) = sl.parse_layouts(name)
    assert len(matching(layout)) == layout.per_node


def test_consumable_claims_take_shares_of_devices_that_allow_several() -> None:
    (layout,) = sl.parse_layouts("consumable")
    selected = set(matching(layout))
    shared = [d for d in devices(layout) if d["name"] in selected]
    assert len(shared) == 8 and all(d.get("allowMultipleAllocations") for d in shared)
    (request,) = sl.claim_template(layout, name="t", namespace="n")["spec"]["spec"]["devices"][
        "requests"
    ]
    asked = request["exactly"]["capacity"]["requests"]["memory"]
    assert asked == "40Gi"
    mib = [int(d["capacity"]["memory"]["value"].removesuffix("Mi")) for d in shared]
    fits = sum(m // (40 * 1024) for m in mib)
    assert fits == layout.per_node


def test_minimal_is_static_with_only_the_type() -> None:
    static, minimal = sl.parse_layouts("static,minimal")
    assert [d["name"] for d in devices(minimal)] == [d["name"] for d in devices(static)]
    assert all(d["attributes"] == {"type": {"string": "gpu"}} for d in devices(minimal))
    assert all(len(d["attributes"]) > 1 for d in devices(static))


def test_no_versions_is_static_less_exactly_its_version_attributes() -> None:
    static, trimmed = sl.parse_layouts("static,no-versions")
    for full, less in zip(devices(static), devices(trimmed), strict=True):
        assert set(full["attributes"]) - set(less["attributes"]) == set(sl.VERSION_ATTRIBUTES)
        assert all(full["attributes"][k] == v for k, v in less["attributes"].items())
        assert less["capacity"] == full["capacity"]
    assert all("version" in devices(static)[0]["attributes"][k] for k in sl.VERSION_ATTRIBUTES)


def test_dynamic_mig_consumes_counters_of_its_own_pool() -> None:
    (layout,) = sl.parse_layouts("dynamic-mig")
    pool = layout.render(NODE, UID)
    sets = {c["name"] for s in pool for c in s["spec"].get("sharedCounters") or []}
    used = {c["counterSet"] for d in devices(layout) for c in d.get("consumesCounters") or []}
    assert used and used <= sets
    assert {s["spec"]["pool"]["name"] for s in pool} == {NODE}


def test_the_small_binding_layout_is_the_first_gpu_of_the_large_one() -> None:
    large, small = sl.parse_layouts("dynamic-mig-bound,dynamic-mig-bound-small")

    def same(body: dict[str, Any]) -> dict[str, Any]:  # UUIDs are drawn from the profile name
        attributes = {k: v for k, v in body["attributes"].items() if "UUID" not in k.upper()}
        return {**body, "attributes": attributes}

    first = [d for d in devices(large) if d["name"].startswith("gpu-0-")]
    assert [same(d) for d in devices(small)] == [same(d) for d in first] and len(first) == 25
    assert all(d["bindingConditions"] for d in devices(small) if "consumesCounters" in d)
    made_of = {d.name for d in sl.devices_of(small, NODE)}
    assert made_of == {d["name"] for d in first}


@pytest.mark.parametrize(
    ("text", "message"),
    [("static,nope", "unknown layout 'nope'"), (",", "no")],
)
def test_layouts_not_there_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sl.parse_layouts(text)


def test_request_counts_become_per_node_per_minute() -> None:
    before: dict[tuple[str, ...], float] = {("GET", "nodes"): 10.0, ("LIST", "resourceslices"): 5.0}
    after: dict[tuple[str, ...], float] = {
        ("GET", "nodes"): 40.0,
        ("LIST", "resourceslices"): 5.0,
        ("WATCH", "pods"): 3.0,
    }
    window = sl.deltas(before, after)
    assert window == {("GET", "nodes"): 30.0, ("WATCH", "pods"): 3.0}
    per = sl.per_node_minute(window, nodes=10, seconds=30.0)
    assert per == pytest.approx({("GET", "nodes"): 6.0, ("WATCH", "pods"): 0.6})


def test_counter_by_sums_the_labels_left_out() -> None:
    samples: dict[str, list[sl.Sample]] = {
        "apiserver_request_total": [
            ({"verb": "GET", "resource": "nodes", "code": "200"}, 4.0),
            ({"verb": "GET", "resource": "nodes", "code": "404"}, 1.0),
            ({"verb": "LIST", "resource": "pods", "code": "200"}, 2.0),
        ]
    }
    assert sl.counter_by(samples, "apiserver_request_total", ("verb", "resource")) == {
        ("GET", "nodes"): 5.0,
        ("LIST", "pods"): 2.0,
    }


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert sl.percentile(values, 0.5) == 50.0
    assert sl.percentile(values, 0.99) == 99.0
    assert sl.percentile([3.0], 0.99) == 3.0


def test_rounds_alternate_their_order_in_namespaces_of_their_own() -> None:
    a, b = sl.parse_layouts("static,minimal")
    runs = sl.schedule([a, b], 3)
    assert [(r.layout.name, r.round) for r in runs] == [
        ("static", 1),
        ("minimal", 1),
        ("minimal", 2),
        ("static", 2),
        ("static", 3),
        ("minimal", 3),
    ]
    assert len({r.namespace for r in runs}) == 6
    assert runs[0].namespace == "scale-static" and runs[0].label == "static"
    assert runs[3].label == "static (2)"
    assert sl.schedule([a, b], 1) == [sl.Run(a), sl.Run(b)]
    with pytest.raises(ValueError):
        sl.schedule([a], 0)


def test_a_layout_is_shown_by_its_median_round() -> None:
    assert sl.median_run({1: 14.7, 2: 11.0, 3: 13.2}) == 3
    assert sl.median_run({1: 14.7, 2: 11.0}) == 2  # the lower middle of an even count
    assert sl.median_run({1: float("nan"), 2: 9.0, 3: 12.0}) == 2
    with pytest.raises(ValueError):
        sl.median_run({1: float("nan")})


def test_a_layout_is_compared_with_the_control_round_by_round() -> None:
    ratios = sl.round_ratios({2: 9.0, 1: 12.0, 3: 10.0}, {1: 15.0, 2: 9.0})
    assert list(ratios) == [1, 2, 3]
    assert ratios[1] == pytest.approx(0.8) and ratios[2] == pytest.approx(1.0)
    assert math.isnan(ratios[3])  # the control has no figure in round 3
