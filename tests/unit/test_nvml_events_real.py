"""The NVML event loop on a real GPU (skipped where NVML does not answer). Read only: it only
registers for events and waits; nothing is injected. Cases: every GPU reports its supported
event types and gets its health events registered; a quiet GPU gives no event in 10 s."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import real_nvml

from dra_gpu.devices import nvml_events
from dra_gpu.devices.nvml_events import NvmlEventLoop

pytestmark = pytest.mark.nvml


@pytest.fixture(scope="module")
def pynvml_ready() -> Iterator[Any]:
    yield from real_nvml.initialized()


def test_the_event_loop_starts_and_stays_quiet(pynvml_ready: Any) -> None:
    out = io.StringIO()
    code = nvml_events.watch(lambda on_event: NvmlEventLoop(on_event=on_event), 10, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    gpus = [line["gpu"] for line in lines if "gpu" in line]
    assert code == 0, lines
    assert gpus and all("xid" in g["registeredKinds"] for g in gpus), gpus
    assert lines[-1]["events"] == 0, lines
