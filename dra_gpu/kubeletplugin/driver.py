"""What a DRA driver gives the kit: prepare and unprepare claims, answered per claim.

The kit's gRPC adapter (:mod:`dra_service`) turns the kubelet's requests into
:class:`ClaimRef` values and the driver's answers back into messages; nothing else of a driver
is known here. A claim's failure is its result's ``error`` (the kubelet shows it in the pod's
events and retries), never an exception for the whole call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_gpu.kubeletplugin.ids import CDIDeviceID, ClaimUID, DeviceName


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    uid: ClaimUID
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet gets it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: DeviceName
    cdi_device_ids: tuple[CDIDeviceID, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    kind: str = ""  # the error's class name: a bounded label for metrics and events


class Driver(Protocol):
    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]:
        """One result per claim of ``refs``."""
        ...

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]:
        """Per claim of ``refs``: "" when done (an unknown claim is done), else why not."""
        ...


class Step(Protocol):
    """What runs after the driver answered a call, before the answer goes back: metrics, Events
    for failed claims, claims' device status. The kit runs the steps in order on the call's
    thread, so a step must not block: its API writes go to a thread of its own."""

    def started(self, operation: str) -> None:
        """``operation`` ("prepare" or "unprepare") is about to call the driver."""
        ...

    def prepared(
        self, refs: Sequence[ClaimRef], results: Mapping[ClaimUID, PrepareResult], seconds: float
    ) -> None:
        """The driver's results for ``refs``, after ``seconds``."""
        ...

    def unprepared(
        self, refs: Sequence[ClaimRef], errors: Mapping[ClaimUID, str], seconds: float
    ) -> None:
        """The driver's per-claim errors ("" = done) for ``refs``, after ``seconds``."""
        ...
