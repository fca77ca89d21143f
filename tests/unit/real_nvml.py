"""NVML for the tests that need a real GPU: initialized, or the test skipped with the reason
(the one kind of skip CI accepts: ``tests/ci_skips.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
from ci_skips import skip_without_gpu


def initialized() -> Iterator[Any]:
    """Yield the initialized ``pynvml`` module (a fixture body); shut NVML down after."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        skip_without_gpu(f"NVML not usable here: {e}")
    yield pynvml
    pynvml.nvmlShutdown()
