"""Polling for cluster tests: the API server and the plugin settle asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float) -> T:
    """Return the probe's first truthy value; fail the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.3)
