"""NVML health events of a node's GPUs: XID critical errors, ECC errors and whatever else the
GPU reports as supported, turned into ``HealthEvent``s. Read only: nothing is written to a GPU.

Design:
- ``open`` initialises NVML, asks every GPU for its supported event types
  (``nvmlDeviceGetSupportedEventTypes``; an H200 answers ``0xff9f``) and registers the
  health-related ones (``HEALTH_KINDS``) in one event set. Clock, P-state and power-source
  events are not about health and are not registered.
- ``run`` waits on the set (``nvmlEventSetWait_v2``, one second at a time) and hands each event
  to the listener. Every NVML call is bounded (``BoundedCaller``, its own worker, so a wait
  never delays discovery): a wedged driver turns into a ``CallTimeoutError``; the loop then
  drops the set and opens it again after ``retry_s``, and while earlier calls are still stuck
  the bounded caller refuses new ones instead of piling up threads. A GPU that cannot be
  registered is reported and the others are still watched.
- An event on a MIG device names its GPU: the whole GPU is affected.
- ECC counters are a second source: every ``ecc_poll_s`` the loop reads each GPU's volatile
  uncorrected ECC count (``nvmlDeviceGetTotalEccErrors``) and reports a rise as an
  ``ecc-double-bit`` event, in case the event itself was missed (a reopened set, a driver
  that does not deliver it). A GPU without ECC (NOT_SUPPORTED) is not polled.

``python -m dra_gpu.devices.nvml_events --watch 60`` opens the loop on this machine's GPUs,
prints what each GPU supports and every event for 60 seconds, as JSON lines.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu.devices import nvml_lib
from dra_gpu.devices.bounded import BoundedCaller, CallTimeoutError
from dra_gpu.devices.health_events import HealthEvent

log = logging.getLogger(__name__)

# nvmlEventType* bit -> event kind (health_rules); the events that say something about health.
HEALTH_KINDS: Mapping[int, str] = {
    0x0001: "ecc-single-bit",
    0x0002: "ecc-double-bit",
    0x0008: "xid",
    0x0200: "ecc-single-bit-storm",
    0x0400: "dram-retirement",
    0x0800: "dram-retirement-failure",
    0x1000: "poison-nonfatal",
    0x2000: "poison-fatal",
    0x4000: "gpu-unavailable",
    0x8000: "gpu-recovery-action",
}
# The other bits, named for the report only.
OTHER_KINDS: Mapping[int, str] = {
    0x0004: "pstate",
    0x0010: "clock",
    0x0080: "power-source-change",
    0x0100: "mig-config-change",
}


def kind_names(mask: int) -> list[str]:
    names = {**HEALTH_KINDS, **OTHER_KINDS}
    return [names.get(1 << bit, f"bit-{bit}") for bit in range(32) if mask & (1 << bit)]


def health_mask(mask: int) -> int:
    return mask & sum(HEALTH_KINDS)


class NvmlEventError(RuntimeError):
    """An NVML call of the event loop failed; the message names the call."""


@dataclasses.dataclass(frozen=True)
class GpuWatch:
    """What one GPU supports and what was registered (the start-up report)."""

    index: int
    uuid: str
    supported: int
    registered: int
    error: str = ""
    ecc_uncorrected: int | None = None  # the volatile count at start; None: not readable

    def report(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "supported": f"{self.supported:#06x}",
            "supportedKinds": kind_names(self.supported),
            "registered": f"{self.registered:#06x}",
            "registeredKinds": kind_names(self.registered),
            "eccUncorrected": self.ecc_uncorrected,
            **({"error": self.error} if self.error else {}),
        }


def _handle_key(handle: Any) -> int:
    """Identity of a device handle: NVML hands out the same pointer for one GPU."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (ctypes.ArgumentError, TypeError):
        return id(handle)  # not a ctypes pointer (a stand-in for pynvml)


Listener = Callable[[HealthEvent], None]


class NvmlEventLoop:
    def __init__(
        self,
        *,
        nvml: Any = None,
        on_event: Listener,
        call_timeout_s: float = 10.0,
        wait_ms: int = 1000,
        retry_s: float = 30.0,
        ecc_poll_s: float = 60.0,
        driver_root: Path = Path("/"),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        if call_timeout_s * 1000 <= wait_ms:
            raise ValueError("call_timeout_s must be longer than one wait")
        self._nvml = nvml
        self._on_event = on_event
        self._caller = BoundedCaller(timeout_s=call_timeout_s, name="nvml-events")
        self._wait_ms = wait_ms
        self._retry_s = retry_s
        self._ecc_poll_s = ecc_poll_s
        self._ecc: dict[str, tuple[Any, int]] = {}  # GPU UUID -> (handle, last count)
        self._driver_root = driver_root
        self._clock = clock
        self._set: Any = None
        self._uuids: dict[int, str] = {}
        self.watching: list[GpuWatch] = []

    def _call(self, fn_name: str, *args: Any) -> Any:
        fn: Callable[..., Any] | None = getattr(self._nvml, fn_name, None)
        if fn is None:
            raise NvmlEventError(f"{fn_name}: not provided by this pynvml")
        try:
            return self._caller.call(fn_name, lambda: fn(*args))
        except self._nvml.NVMLError as err:
            raise NvmlEventError(f"{fn_name}: {err}") from err

    def open(self) -> list[GpuWatch]:
        """Initialise NVML and register every GPU's health events; raises NvmlEventError or
        CallTimeoutError when NVML as a whole cannot be used."""
        if nvml_lib.needs_library(self._nvml):
            try:
                handle, shown = nvml_lib.load(self._driver_root)
            except nvml_lib.NvmlLibraryError as err:
                raise NvmlEventError(str(err)) from err
            if nvml_lib.install(self._nvml, handle):
                log.info("NVML loaded from %s", shown)
        self._call("nvmlInit")
        try:
            self._set = self._call("nvmlEventSetCreate")
            count = int(self._call("nvmlDeviceGetCount"))
        except (NvmlEventError, CallTimeoutError):
            self.close()
            raise
        self._uuids, self._ecc = {}, {}
        self.watching = [self._register(index) for index in range(count)]
        return self.watching

    def _register(self, index: int) -> GpuWatch:
        uuid, supported = "", 0
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            uuid = str(self._call("nvmlDeviceGetUUID", handle))
            supported = int(self._call("nvmlDeviceGetSupportedEventTypes", handle))
            wanted = health_mask(supported)
            if wanted:
                self._call("nvmlDeviceRegisterEvents", handle, wanted, self._set)
        except (NvmlEventError, CallTimeoutError) as err:
            log.error("GPU index %d: health events not watched: %s", index, err)
            return GpuWatch(index, uuid, supported, 0, str(err))
        self._uuids[_handle_key(handle)] = uuid
        ecc = self._ecc_count(handle)
        if ecc is not None:
            self._ecc[uuid] = (handle, ecc)
        log.info(
            "GPU index %d (%s): watching %s (supported %#06x)",
            index,
            uuid,
            ", ".join(kind_names(wanted)) or "nothing",
            supported,
        )
        return GpuWatch(index, uuid, supported, wanted, ecc_uncorrected=ecc)

    def _ecc_count(self, handle: Any) -> int | None:
        """The volatile uncorrected ECC count, or None where it cannot be read (no ECC)."""
        try:
            return int(
                self._call(
                    "nvmlDeviceGetTotalEccErrors",
                    handle,
                    self._nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    self._nvml.NVML_VOLATILE_ECC,
                )
            )
        except (NvmlEventError, CallTimeoutError) as err:
            log.debug("ECC count not readable: %s", err)
            return None

    def poll_counters(self) -> list[HealthEvent]:
        """``ecc-double-bit`` events for the GPUs whose uncorrected ECC count went up."""
        events: list[HealthEvent] = []
        for uuid, (handle, before) in sorted(self._ecc.items()):
            now = self._ecc_count(handle)
            if now is None:
                continue
            self._ecc[uuid] = (handle, now)
            if now > before:
                log.warning("GPU %s: uncorrected ECC errors %d -> %d", uuid, before, now)
                events.append(HealthEvent(uuid, "ecc-double-bit", now, self._clock()))
        return events

    def close(self) -> None:
        """Free the event set and shut NVML down; failures are logged (a wedged driver)."""
        for fn, args in (("nvmlEventSetFree", (self._set,)), ("nvmlShutdown", ())):
            if fn == "nvmlEventSetFree" and self._set is None:
                continue
            try:
                self._call(fn, *args)
            except (NvmlEventError, CallTimeoutError) as err:
                log.warning("%s failed: %s", fn, err)
        self._set = None

    def probe(self, uuid: str) -> bool:
        """Whether the GPU answers NVML (its handle and PCI info), while the loop is open."""
        if self._set is None:
            return False
        try:
            handle = self._call("nvmlDeviceGetHandleByUUID", uuid)
            self._call("nvmlDeviceGetPciInfo", handle)
        except (NvmlEventError, CallTimeoutError) as err:
            log.info("GPU %s does not pass its health probe: %s", uuid, err)
            return False
        return True

    def wait_once(self) -> HealthEvent | None:
        """One wait: the next health event, or None when none came within ``wait_ms``."""
        try:
            data = self._call("nvmlEventSetWait_v2", self._set, self._wait_ms)
        except NvmlEventError as err:
            cause = err.__cause__
            if getattr(cause, "value", None) == getattr(self._nvml, "NVML_ERROR_TIMEOUT", -1):
                return None
            raise
        kind = HEALTH_KINDS.get(int(data.eventType))
        if kind is None:
            return None
        uuid = self._uuids.get(_handle_key(data.device))
        if uuid is None:
            uuid = str(self._call("nvmlDeviceGetUUID", data.device))
        return HealthEvent(gpu=uuid, kind=kind, code=int(data.eventData), at=self._clock())

    def run(self, stop: threading.Event) -> None:
        """Open, wait and deliver until ``stop``; reopens after failures (see the module doc)."""
        while not stop.is_set():
            try:
                if self._set is None:
                    self.open()
                polled = time.monotonic()
                while not stop.is_set():
                    event = self.wait_once()
                    if event is not None:
                        self._on_event(event)
                    if time.monotonic() - polled >= self._ecc_poll_s:
                        polled = time.monotonic()
                        for counted in self.poll_counters():
                            self._on_event(counted)
            except (NvmlEventError, CallTimeoutError) as err:
                log.error("NVML health events: %s; trying again in %gs", err, self._retry_s)
            except Exception:
                log.exception("NVML health events failed; trying again in %gs", self._retry_s)
            if self._set is not None:
                self.close()
            stop.wait(self._retry_s)
        if self._set is not None:
            self.close()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="nvml-events", daemon=True)
        thread.start()
        return thread


def watch(
    loop_factory: Callable[[Listener], NvmlEventLoop], seconds: float, out: Any = sys.stdout
) -> int:
    """The ``--watch`` report: what each GPU supports, then each event for ``seconds``."""

    def emit(doc: Mapping[str, Any]) -> None:
        print(json.dumps(doc, sort_keys=True), file=out, flush=True)

    events: list[HealthEvent] = []

    def on_event(event: HealthEvent) -> None:
        events.append(event)
        emit({"event": dataclasses.asdict(event)})

    loop = loop_factory(on_event)
    try:
        gpus = loop.open()
    except (NvmlEventError, CallTimeoutError) as err:
        emit({"error": str(err)})
        return 1
    for gpu in gpus:
        emit({"gpu": gpu.report()})
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            event = loop.wait_once()
            if event is not None:
                on_event(event)
    except (NvmlEventError, CallTimeoutError) as err:
        emit({"error": str(err)})
        return 1
    finally:
        loop.close()
    emit({"watchedSeconds": seconds, "events": len(events), "gpus": len(gpus)})
    return 1 if any(g.error for g in gpus) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dra_gpu.devices.nvml_events",
        description="Watch this machine's GPUs for NVML health events (read only).",
    )
    parser.add_argument("--watch", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--driver-root", type=Path, default=Path("/"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return watch(
        lambda on_event: NvmlEventLoop(on_event=on_event, driver_root=args.driver_root),
        args.watch,
    )


if __name__ == "__main__":
    raise SystemExit(main())
