"""Leader election: pure decisions, and two electors on one in-memory Lease with a fake clock.

Cases: no lease -> create; ours -> renew; free -> acquire; someone else's live lease -> follow,
expired (unchanged for its duration, on the local clock) -> acquire with a transition; two
candidates: exactly one leads; the leader stops renewing -> the other takes over only after
the duration, and the old one stops considering itself leader after the renew deadline;
release hands over on the follower's next step; a race on write loses cleanly; API errors
keep a follower following; Lease spec round-trips and tolerates junk.
"""

from __future__ import annotations

import datetime as dt

import pytest

from dra_gpu.controller import electing, leases

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=dt.UTC)
TIMING = leases.Timing()


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return T0 + dt.timedelta(seconds=self.t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class MemoryStore:
    """One Lease with resourceVersion semantics; ``down`` simulates an unreachable server."""

    def __init__(self) -> None:
        self.record: leases.LeaseRecord | None = None
        self.version = 0
        self.down = False

    def get(self) -> tuple[leases.LeaseRecord, str] | None:
        if self.down:
            raise ConnectionError("api server down")
        return None if self.record is None else (self.record, str(self.version))

    def create(self, record: leases.LeaseRecord) -> str:
        if self.down:
            raise ConnectionError("api server down")
        if self.record is not None:
            raise electing.LeaseConflict("exists")
        return self._put(record)

    def update(self, record: leases.LeaseRecord, version: str) -> str:
        if self.down:
            raise ConnectionError("api server down")
        if version != str(self.version):
            raise electing.LeaseConflict("stale")
        return self._put(record)

    def _put(self, record: leases.LeaseRecord) -> str:
        self.record, self.version = record, self.version + 1
        return str(self.version)


def rec(holder: str, **kw: object) -> leases.LeaseRecord:
    return leases.LeaseRecord(holder=holder, duration_s=15, renew_time=T0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "age", "expected"),
    [
        pytest.param(None, 0, leases.Decision.CREATE, id="none"),
        pytest.param(rec("me"), 100, leases.Decision.RENEW, id="ours"),
        pytest.param(rec(""), 0, leases.Decision.ACQUIRE, id="released"),
        pytest.param(rec("other"), 14.9, leases.Decision.FOLLOW, id="live"),
        pytest.param(rec("other"), 15, leases.Decision.ACQUIRE, id="expired"),
    ],
)
def test_decide(record: leases.LeaseRecord | None, age: float, expected: leases.Decision) -> None:
    obs = leases.Observation(record, "1", changed_at=0.0)
    assert leases.decide(obs, identity="me", now=age) is expected


def test_expiry_counts_from_last_change_not_from_remote_time() -> None:
    first = leases.observe(None, rec("other"), "1", now=0.0)
    same = leases.observe(first, rec("other"), "1", now=10.0)
    assert same.changed_at == 0.0
    renewal = leases.LeaseRecord("other", 15, renew_time=T0 + dt.timedelta(seconds=5))
    renewed = leases.observe(same, renewal, "2", now=12.0)
    assert renewed.changed_at == 12.0
    assert leases.decide(renewed, identity="me", now=20.0) is leases.Decision.FOLLOW


def test_acquire_counts_a_transition_renew_does_not() -> None:
    old = rec("other", transitions=3)
    taken = leases.next_record(
        leases.Decision.ACQUIRE, old, identity="me", wall_now=T0, timing=TIMING
    )
    assert (taken.holder, taken.transitions, taken.acquire_time) == ("me", 4, T0)
    later = T0 + dt.timedelta(seconds=5)
    renewed = leases.next_record(
        leases.Decision.RENEW, taken, identity="me", wall_now=later, timing=TIMING
    )
    assert (renewed.transitions, renewed.acquire_time, renewed.renew_time) == (4, T0, later)


def test_spec_round_trip_and_tolerance() -> None:
    record = leases.LeaseRecord("me", 15, T0, T0, 2)
    spec = leases.to_spec(record)
    assert spec["renewTime"] == "2026-11-30T12:00:00.123456Z"
    assert leases.from_spec(spec) == record
    junk = leases.from_spec(
        {"holderIdentity": None, "leaseDurationSeconds": "x", "renewTime": "yesterday"}
    )
    assert junk == leases.LeaseRecord("", 1, None, None, 0)


@pytest.fixture
def pair() -> tuple[FakeClock, MemoryStore, electing.Elector, electing.Elector]:
    clock, store = FakeClock(), MemoryStore()
    a = electing.Elector(store, identity="a", clock=clock, timing=TIMING)
    b = electing.Elector(store, identity="b", clock=clock, timing=TIMING)
    return clock, store, a, b


def test_only_one_of_two_leads(
    pair: tuple[FakeClock, MemoryStore, electing.Elector, electing.Elector],
) -> None:
    clock, store, a, b = pair
    assert a.step() == TIMING.renew_period
    assert b.step() == TIMING.retry_period
    for _ in range(10):
        clock.advance(2)
        a.step()
        b.step()
        assert (a.is_leader, b.is_leader) == (True, False)
    assert store.record is not None and store.record.holder == "a"


def test_takeover_after_leader_dies(
    pair: tuple[FakeClock, MemoryStore, electing.Elector, electing.Elector],
) -> None:
    clock, store, a, b = pair
    a.step()
    b.step()
    # a dies silently (no more steps). b must wait the full lease duration.
    clock.advance(TIMING.lease_duration - 1)
    b.step()
    assert not b.is_leader
    assert not a.is_leader  # past its renew deadline: the stale leader has stood down
    clock.advance(1)
    b.step()
    assert b.is_leader
    assert store.record is not None and (store.record.holder, store.record.transitions) == ("b", 1)


def test_release_hands_over_at_once(
    pair: tuple[FakeClock, MemoryStore, electing.Elector, electing.Elector],
) -> None:
    clock, _store, a, b = pair
    a.step()
    b.step()
    a.release()
    assert not a.is_leader
    clock.advance(TIMING.retry_period)
    b.step()
    assert b.is_leader


def test_leader_steps_down_when_api_unreachable(
    pair: tuple[FakeClock, MemoryStore, electing.Elector, electing.Elector],
) -> None:
    clock, store, a, _ = pair
    a.step()
    store.down = True
    clock.advance(TIMING.renew_deadline - 0.5)
    assert a.step() == TIMING.retry_period
    assert a.is_leader
    clock.advance(1)
    assert not a.is_leader


def test_race_for_free_lease_has_one_winner(
    pair: tuple[FakeClock, MemoryStore, electing.Elector, electing.Elector],
) -> None:
    _clock, store, a, b = pair
    store.record = rec("")  # released
    real_get = store.get
    reads = [real_get(), real_get()]  # both read the same free lease before either writes
    store.get = lambda: reads.pop(0)  # type: ignore[method-assign]
    a.step()
    b.step()
    assert (a.is_leader, b.is_leader) == (True, False)
