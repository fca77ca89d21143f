"""The webhook refuses requests that ask more capacity than any published device has.

Cases (table): a request of ``gpu.nvidia.com`` asking more memory than the largest published
GPU is refused naming the request, the amount and the most; asking at most that is allowed;
``mig.nvidia.com`` is judged against MIG devices only; other classes, other domains and
unknown capacities pass; nothing is refused while nothing is known. The largest amounts come
from the published slices of this driver only; the list runs at most once per period, only
for a review that asks for capacity, one at a time (reviews meanwhile take the last answer),
and a failed list keeps the last answer (never refusing for it).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fake_claims import inventory
from test_controller_admission import claim_review

from dra_gpu.controller import admission, published_capacity
from dra_gpu.devices import shares
from dra_gpu.kube.errors import ApiError
from dra_gpu.plugin import published

SLICES = published.node_slices(
    list(inventory().values()),  # a full A100 of 40Gi and MIG devices up to 20Gi
    driver_name="gpu.nvidia.com",
    node_name="n",
    node_uid=None,
    shares=shares.ShareMode("memory"),
)
OTHER = {
    "spec": {
        "driver": "other.example.com",
        "devices": [
            {
                "name": "x",
                "attributes": {"type": {"string": "gpu"}},
                "capacity": {"memory": {"value": "1Ti"}},
            }
        ],
    }
}
LARGEST = published_capacity.largest([*SLICES, OTHER])


def asking(device_class: str, requests: dict[str, str]) -> dict[str, Any]:
    exactly = {"deviceClassName": device_class, "capacity": {"requests": requests}}
    return {"requests": [{"name": "gpu", "exactly": exactly}]}


def test_largest_per_class_from_this_drivers_slices() -> None:
    assert LARGEST["gpu.nvidia.com"]["memory"] == 40 * 1024**3
    assert LARGEST["mig.nvidia.com"]["memory"] == 19968 * 1024**2  # 3g.20gb, whole MiB
    assert LARGEST["mig.nvidia.com"]["multiprocessors"] == 56


@pytest.mark.parametrize(
    ("device_class", "requests", "refusal"),
    [
        (
            "gpu.nvidia.com",
            {"memory": "48Gi"},
            "spec.devices.requests[0].exactly.capacity.requests.memory: asks 48Gi, the most any "
            "published device of class gpu.nvidia.com has is 40Gi: it can never be allocated",
        ),
        (
            "gpu.nvidia.com",
            {"gpu.nvidia.com/memory": "41Gi"},
            "spec.devices.requests[0].exactly.capacity.requests.gpu.nvidia.com/memory: asks 41Gi,"
            " the most any published device of class gpu.nvidia.com has is 40Gi: it can never be"
            " allocated",
        ),
        ("gpu.nvidia.com", {"memory": "40Gi"}, None),
        (
            "mig.nvidia.com",
            {"memory": "30Gi"},
            "spec.devices.requests[0].exactly.capacity.requests.memory: asks 30Gi, the most any "
            "published device of class mig.nvidia.com has is 19968Mi: it can never be allocated",
        ),
        (
            "mig.nvidia.com",
            {"multiprocessors": "60"},
            "spec.devices.requests[0].exactly.capacity.requests.multiprocessors: asks 60, the "
            "most any published device of class mig.nvidia.com has is 56: it can never be "
            "allocated",
        ),
        ("other-class", {"memory": "1Ti"}, None),
        ("gpu.nvidia.com", {"example.com/memory": "1Ti"}, None),
        ("gpu.nvidia.com", {"unknown": "5"}, None),
    ],
)
def test_requests_no_device_can_meet_are_refused(
    device_class: str, requests: dict[str, str], refusal: str | None
) -> None:
    out = admission.review(claim_review(asking(device_class, requests)), largest=lambda: LARGEST)
    assert out["response"]["allowed"] is (refusal is None)
    if refusal is not None:
        assert out["response"]["status"]["message"] == refusal


def test_nothing_is_refused_while_nothing_is_known() -> None:
    review = claim_review(asking("gpu.nvidia.com", {"memory": "1Ei"}))
    assert admission.review(review, largest=lambda: None)["response"]["allowed"] is True
    assert admission.review(review, largest=lambda: {})["response"]["allowed"] is True


def test_the_list_runs_once_per_period_and_a_failure_keeps_the_last_answer() -> None:
    now = [0.0]
    answers: list[Any] = [list(SLICES), ApiError("boom", request="GET slices"), list(SLICES)]
    calls = []

    def fetch() -> list[Any]:
        calls.append(now[0])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    cache = published_capacity.PublishedCapacity(fetch, max_age_s=30, clock=lambda: now[0])
    assert cache.get() == LARGEST_OURS
    now[0] = 10
    assert cache.get() == LARGEST_OURS and calls == [0.0]
    now[0] = 31
    assert cache.get() == LARGEST_OURS and calls == [0.0, 31]  # failed: the last answer kept
    now[0] = 62
    assert cache.get() == LARGEST_OURS and len(calls) == 3


LARGEST_OURS = published_capacity.largest(SLICES)


def test_only_a_review_asking_for_capacity_lists_the_slices() -> None:
    # Listing every slice costs the API server dearly in a large cluster: a claim that asks for
    # no capacity (most claims) must not pay for it on its way in.
    calls = []

    def fetch() -> list[Any]:
        calls.append(1)
        return list(SLICES)

    cache = published_capacity.PublishedCapacity(fetch)
    plain = claim_review(asking("gpu.nvidia.com", {}))
    assert admission.review(plain, largest=cache.get)["response"]["allowed"] is True
    assert calls == []
    too_much = claim_review(asking("gpu.nvidia.com", {"memory": "1Ti"}))
    assert admission.review(too_much, largest=cache.get)["response"]["allowed"] is False
    assert calls == [1]


def test_reviews_during_a_list_take_the_last_answer_instead_of_listing_too() -> None:
    now = [0.0]
    release, listing = threading.Event(), threading.Event()
    calls = []

    def fetch() -> list[Any]:
        calls.append(now[0])
        if len(calls) == 2:  # the second list hangs until released
            listing.set()
            release.wait(20)
        return list(SLICES)

    cache = published_capacity.PublishedCapacity(fetch, max_age_s=30, clock=lambda: now[0])
    assert cache.get() == LARGEST_OURS
    now[0] = 31
    slow = threading.Thread(target=cache.get)
    slow.start()
    assert listing.wait(20)
    assert cache.get() == LARGEST_OURS  # stale, but no second list beside the running one
    assert len(calls) == 2
    release.set()
    slow.join(20)
    assert cache.get() == LARGEST_OURS and len(calls) == 2  # the new answer is fresh
