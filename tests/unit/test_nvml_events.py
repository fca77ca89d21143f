"""The NVML event loop against the fake NVML: what the H200 supports is reported and only
health events are registered; events reach the listener with their GPU; the ``--watch`` report
stays quiet when nothing happens; a wedged wait does not hang the loop, which opens again; a
rising uncorrected ECC count is reported once."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pynvml
import pytest
from nvml_fakes import FakeGpu, FakeNvml

from dra_gpu.devices import nvml_events
from dra_gpu.devices.health_events import HealthEvent
from dra_gpu.devices.nvml_events import NvmlEventLoop


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    f = FakeNvml([FakeGpu(index=i, minor=i, uuid=f"GPU-{i}") for i in range(2)])
    yield f
    f.release.set()


def loop_on(fake: FakeNvml, events: list[HealthEvent], **kw: float) -> NvmlEventLoop:
    return NvmlEventLoop(
        nvml=fake,
        on_event=events.append,
        wait_ms=10,
        clock=lambda: 5.0,
        **kw,  # type: ignore[arg-type]
    )


def test_registers_the_health_events_the_gpu_supports(fake: FakeNvml) -> None:
    watched = loop_on(fake, []).open()
    report = watched[0].report()
    assert report["supported"] == "0xff9f"
    assert "xid" in report["supportedKinds"] and "clock" in report["supportedKinds"]
    assert fake.registered == {0: 0xFE0B, 1: 0xFE0B}  # no pstate, clock, power, MIG change
    assert "clock" not in report["registeredKinds"]


def test_events_reach_the_listener_with_their_gpu(fake: FakeNvml) -> None:
    events: list[HealthEvent] = []
    loop = loop_on(fake, events)
    loop.open()
    fake.pending += [(1, pynvml.nvmlEventTypeXidCriticalError, 79), (0, 0x0004, 0)]
    assert loop.wait_once() == HealthEvent("GPU-1", "xid", 79, 5.0)
    assert loop.wait_once() is None  # a P-state change is not about health
    assert loop.wait_once() is None  # NVML's timeout: nothing happened
    fake.pending.append((0, pynvml.nvmlEventTypeDoubleBitEccError, 0))
    assert loop.wait_once() == HealthEvent("GPU-0", "ecc-double-bit", 0, 5.0)


def test_a_gpu_that_cannot_register_is_reported_and_the_others_watched(fake: FakeNvml) -> None:
    fake.fail[("nvmlDeviceGetSupportedEventTypes", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    first, second = loop_on(fake, []).open()
    assert "nvmlDeviceGetSupportedEventTypes" in first.error
    assert second.registered and not second.error


def test_watch_reports_support_and_stays_quiet(fake: FakeNvml) -> None:
    out = io.StringIO()
    assert nvml_events.watch(lambda on_event: loop_on(fake, []), 0.2, out) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["gpu"]["supported"] for line in lines[:2]] == ["0xff9f", "0xff9f"]
    assert lines[-1] == {"watchedSeconds": 0.2, "events": 0, "gpus": 2}
    assert "nvmlEventSetFree" in fake.calls and fake.calls[-1] == "nvmlShutdown"


def test_a_wedged_wait_is_abandoned_and_the_loop_opens_again(fake: FakeNvml) -> None:
    events: list[HealthEvent] = []
    fake.hang.add(("nvmlEventSetWait_v2", None))
    loop = NvmlEventLoop(
        nvml=fake, on_event=events.append, wait_ms=10, call_timeout_s=0.1, retry_s=0.05
    )
    stop = threading.Event()
    thread = loop.start(stop)
    try:
        waited = threading.Event()
        waited.wait(0.5)  # several timed-out waits and reopenings
        assert fake.calls.count("nvmlInit") >= 2
        fake.hang.clear()
        fake.release.set()  # the driver lets go
        waited.wait(0.3)  # abandoned waits return (what they read is lost with them)
        fake.pending.append((0, pynvml.nvmlEventTypeXidCriticalError, 48))
        for _ in range(100):
            if events:
                break
            waited.wait(0.05)
        assert [(e.gpu, e.code) for e in events] == [("GPU-0", 48)]
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_probe_asks_the_gpu(fake: FakeNvml) -> None:
    loop = loop_on(fake, [])
    assert not loop.probe("GPU-0")  # not open: nothing to ask with
    loop.open()
    assert loop.probe("GPU-0")
    fake.fail[("nvmlDeviceGetPciInfo", 0)] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert not loop.probe("GPU-0")


def test_a_rising_ecc_count_is_reported_when_the_event_was_missed(fake: FakeNvml) -> None:
    fake.gpus[1].ecc_uncorrected = None  # ECC off: not polled
    loop = loop_on(fake, [])
    first, second = loop.open()
    assert (first.ecc_uncorrected, second.ecc_uncorrected) == (0, None)
    assert loop.poll_counters() == []
    fake.gpus[0].ecc_uncorrected = 2
    assert loop.poll_counters() == [HealthEvent("GPU-0", "ecc-double-bit", 2, 5.0)]
    assert loop.poll_counters() == []  # reported once per rise
