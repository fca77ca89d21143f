"""NVML for the tests that need a real GPU: initialized, or the test skipped with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def initialized() -> Iterator[Any]:
    """Yield the initialized ``pynvml`` module (a fixture body); shut NVML down after."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"NVML not usable here: {e}")
    yield pynvml
    pynvml.nvmlShutdown()
