"""Calls with a bounded wait (``dra_gpu.devices.bounded``), as NVML discovery uses them.

Cases: a result and an exception come back; a hung call times out naming the call and the next
call runs on a fresh worker; once ``max_stuck`` workers are still stuck, calls fail at once
without a new thread (re-discovery every minute must not pile up threads on a wedged driver),
and run again once the driver lets the stuck calls go.
"""

from __future__ import annotations

import threading

import pytest

from dra_gpu.devices.bounded import BoundedCaller, CallTimeoutError


def test_result_and_exception_come_back() -> None:
    caller = BoundedCaller(timeout_s=5)
    assert caller.call("add", lambda: 1 + 1) == 2

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        caller.call("fail", fail)


def test_stuck_workers_are_capped_until_the_driver_lets_go() -> None:
    driver = threading.Event()
    started: list[str] = []

    def hang() -> str:
        started.append("hang")
        driver.wait(30)
        return "late"

    caller = BoundedCaller(timeout_s=0.05, max_stuck=2)
    try:
        for _ in range(2):
            with pytest.raises(CallTimeoutError, match=r"hang did not return within 0\.05s"):
                caller.call("hang", hang)
        with pytest.raises(CallTimeoutError, match="2 earlier calls are still stuck"):
            caller.call("hang", hang)
        assert started == ["hang", "hang"], "no third thread entered the driver"
    finally:
        driver.set()
    for _ in range(100):
        if caller.stuck_workers == 0:
            break
        threading.Event().wait(0.05)
    assert caller.call("answer", lambda: 42) == 42
