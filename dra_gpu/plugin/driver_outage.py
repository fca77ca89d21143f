"""The kernel driver as the health monitor sees it: loaded, out, or back (pure; no I/O, no clock).

A driver upgrade (the GPU Operator unloads the kernel modules, installs another version, loads
it) happens under the running plugin. The monitor looks at the driver every few seconds
(``platforms.Platform.driver``) and feeds each look, and each re-discovery, to this machine:

==========  ====================================  ==========================================
state       meaning                               what the plugin does
==========  ====================================  ==========================================
``Loaded``  NVML answers; the published devices   nothing special
            are this driver's
``Out``     NVML cannot be used (``Driver Not     every device tainted ``<driver>/driver-
            Loaded``, a version mismatch, ...)    unavailable`` (NoSchedule); new prepares
                                                  refused; prepared claims and their CDI
                                                  specs kept as they are
``Back``    NVML answers again                    the same, until one re-discovery has
                                                  published the devices as they are now
==========  ====================================  ==========================================

Transitions (``look``: one look at the driver; ``rediscovered``: the inventory was published
again):

- ``Loaded`` -look: not loaded-> ``Out``: :class:`Began`;
- ``Loaded`` -look: another version-> ``Back``: :class:`Began` (reloaded between two looks);
- ``Out`` -look: loaded-> ``Back`` (``Loaded`` at once, :class:`Ended`, when nothing
  re-discovers: the published facts stay as they were);
- ``Back`` -look: not loaded-> ``Out`` (the same outage goes on);
- ``Back`` -rediscovered-> ``Loaded``: :class:`Ended`, with the outage's length and versions.

A look that tells nothing (None: a profile file half written) changes nothing; a re-discovery
in ``Loaded`` or ``Out`` changes nothing. The taint's value and ``timeAdded`` are the outage's
start, so a look that changes nothing re-publishes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime

from dra_gpu.devices import health_rules
from dra_gpu.devices.model import DriverStatus
from dra_gpu.plugin.device_taints import DRIVER_UNAVAILABLE, Fault


@dataclasses.dataclass(frozen=True)
class Loaded:
    version: str = ""  # "" until the first look (the start-up discovery does not say)
    cuda_version: str = ""


@dataclasses.dataclass(frozen=True)
class Out:
    since: float  # unix seconds of the look that found it out
    reason: str  # NVML's words
    before: str  # the driver version before the outage ("" when unknown)


@dataclasses.dataclass(frozen=True)
class Back:
    since: float  # when the outage began
    reason: str
    before: str
    version: str  # the driver loaded now
    cuda_version: str


State = Loaded | Out | Back


@dataclasses.dataclass(frozen=True)
class Began:
    at: float
    reason: str
    before: str


@dataclasses.dataclass(frozen=True)
class Ended:
    seconds: float  # from the first look that found the driver out to the re-discovery
    before: str
    version: str
    cuda_version: str


Change = Began | Ended


def look(
    state: State, status: DriverStatus | None, *, now: float, rediscovers: bool = True
) -> tuple[State, Change | None]:
    """``state`` after one look at the driver, and the change it makes, if any.

    ``rediscovers``: whether a re-discovery follows (else ``Back`` ends the outage at once)."""
    if status is None:
        return state, None
    if isinstance(state, Loaded):
        if not status.loaded:
            began = Began(now, status.reason, state.version)
            return Out(now, status.reason, state.version), began
        if not state.version or status.version == state.version:
            return Loaded(status.version, status.cuda_version), None
        reason = f"driver {state.version} replaced by {status.version}"
        began = Began(now, reason, state.version)
        back = Back(now, reason, state.version, status.version, status.cuda_version)
        return (back, began) if rediscovers else _ended(back, now)
    if not status.loaded:
        return Out(state.since, state.reason, state.before), None
    back = Back(state.since, state.reason, state.before, status.version, status.cuda_version)
    return (back, None) if rediscovers else _ended(back, now)


def rediscovered(state: State, *, now: float) -> tuple[State, Change | None]:
    """``state`` after the inventory was discovered and published again."""
    if isinstance(state, Back):
        return _ended(state, now)
    return state, None


def _ended(back: Back, now: float) -> tuple[State, Ended]:
    ended = Ended(max(0.0, now - back.since), back.before, back.version, back.cuda_version)
    return Loaded(back.version, back.cuda_version), ended


def restart_needed(state: State) -> str | None:
    """Why the plugin must restart to use the driver again, or None (its liveness check).

    NVML's library is loaded once per process: after an upgrade the library this process loaded
    is the old one, and against the new kernel module every ``nvmlInit`` answers "NVML/RM version
    mismatch" for as long as the process lives. The pod's restart mounts and loads the new one
    (the kubelet restarts it when ``/healthz`` fails)."""
    if isinstance(state, Out) and "version mismatch" in state.reason.lower():
        return (
            f"the NVML library this process loaded does not match the kernel driver loaded now "
            f"({state.reason}): restarting loads the new one"
        )
    return None


def fault(state: State) -> Fault | None:
    """The taint every device carries while the driver is out or back (not re-discovered)."""
    if isinstance(state, Loaded):
        return None
    return Fault(
        DRIVER_UNAVAILABLE, health_rules.NO_SCHEDULE, state.reason, state.since, state.since
    )


def _utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(int(ts), tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def refusal(state: State) -> str | None:
    """Why a new prepare is refused now (the kubelet retries it), or None."""
    if isinstance(state, Out):
        return (
            f"the NVIDIA driver is unavailable since {_utc(state.since)} ({state.reason}); "
            "new claims are prepared once it is loaded again (the kubelet retries)"
        )
    if isinstance(state, Back):
        return (
            f"the NVIDIA driver {state.version} was loaded again after an outage since "
            f"{_utc(state.since)}; new claims are prepared once its devices are re-discovered "
            "(the kubelet retries)"
        )
    return None


def describe(change: Change) -> tuple[str, str]:
    """(Event reason, message) of a change, for the Node's Events and the log."""
    if isinstance(change, Began):
        was = f" (was {change.before})" if change.before else ""
        return (
            "GpuDriverUnavailable",
            f"the NVIDIA driver is unavailable{was}: {change.reason}; its devices are tainted "
            f"{DRIVER_UNAVAILABLE} (NoSchedule) and new claims are not prepared until it is back",
        )
    was = f"{change.before} -> " if change.before and change.before != change.version else ""
    return (
        "GpuDriverRestored",
        f"the NVIDIA driver is back after {change.seconds:.0f}s: {was}{change.version} "
        f"(CUDA {change.cuda_version}); devices re-discovered and published, "
        f"{DRIVER_UNAVAILABLE} taint removed",
    )
