"""What prepare, unprepare and start-up call to apply a claim's sharing settings and undo them.

Order in prepare (``state``): ``PrepareStarted`` recorded (with the configs, so a crash from
here on is known) -> :meth:`Sharing.apply` -> CDI spec -> ``PrepareCompleted``. Unprepare:
spec removed -> :meth:`Sharing.undo` -> record dropped. Start-up, after the checkpoint settled
(``PrepareStarted`` records rolled back): :meth:`Sharing.repair` makes the node match the
completed records, whatever a crash left: every GPU gets the interval its completed claims ask
for, else Default (also after a reboot, which loses the setting); every completed MPS claim's
daemon answers (else it is started again); every other daemon is stopped and its directories
removed. Each step is idempotent, so a crash during repair is repaired by the next start.

Switches (``--time-slicing-settings``, ``--mps-support``): off, a config is validated and
reaches the container environment only, as before this module existed.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gpu.config import strategies
from dra_gpu.config.strategies import MPS, TIME_SLICING
from dra_gpu.errors import UserError
from dra_gpu.prepare.cdi import ClaimDevice
from dra_gpu.prepare.checkpoint import ClaimRecord
from dra_gpu.prepare.sharing import mps, timeslice
from dra_gpu.prepare.sharing.runner import CommandFailed, RecordingRunner, Runner

log = logging.getLogger(__name__)

RECORD_FILE = "sharing-commands.jsonl"


class SharingError(UserError, RuntimeError):
    """The claim's sharing settings cannot be applied; the message names device and reason."""


@dataclass(frozen=True)
class Switches:
    time_slicing: bool = False
    mps: bool = False

    @classmethod
    def of(cls, enabled: Iterable[str]) -> Switches:
        """The switches of the strategies named in ``enabled`` on, the others off."""
        on = frozenset(enabled)
        return cls(time_slicing=TIME_SLICING in on, mps=MPS in on)

    @property
    def enabled(self) -> frozenset[str]:
        """The names of the strategies applied (rows of ``dra_gpu.config.strategies``)."""
        return frozenset(
            name for name, on in ((TIME_SLICING, self.time_slicing), (MPS, self.mps)) if on
        )


def recording_path(state_dir: Path) -> Path:
    """Where a simulated node records the commands a real GPU would get."""
    return state_dir / RECORD_FILE


@dataclass(frozen=True)
class Sharing:
    runner: Runner
    state_dir: Path
    switches: Switches = field(default_factory=Switches)
    # Held while intervals are set, and while a reset reads which claims still hold the GPU
    # and resets it: a claim recorded after that read applies its interval after the reset,
    # never before it (it would be undone).
    _intervals: threading.Lock = field(default_factory=threading.Lock, compare=False)

    @classmethod
    def off(cls, state_dir: Path) -> Sharing:
        return cls(runner=RecordingRunner(recording_path(state_dir)), state_dir=state_dir)

    @property
    def active(self) -> bool:
        """Whether any strategy is applied (off: prepare and unprepare skip sharing's reads)."""
        return self.switches.time_slicing or self.switches.mps

    @functools.cached_property
    def limits_shares(self) -> bool:
        """Whether each consumable share gets its memory and compute caps (the strategy that
        caps shares is applied: ``strategies.share_limiter``). Asked at every prepare; the
        switches never change, so it is worked out once."""
        return strategies.limits_shares_when(self.switches.enabled)

    @functools.cached_property
    def _mps(self) -> mps.MpsControl:
        """Built once: it holds only the runner and the state directory, both fixed."""
        return mps.MpsControl(self.runner, self.state_dir)

    # --- pure parts ---------------------------------------------------------------------------

    def conflict(
        self, devices: Iterable[ClaimDevice], *, other_uid: str, other: ClaimRecord
    ) -> str | None:
        if not self.switches.time_slicing:
            return None
        return timeslice.conflict(devices, other_uid=other_uid, other=other)

    def cdi_edits(
        self, claim_uid: str, devices: Sequence[ClaimDevice]
    ) -> dict[str, dict[str, Any]]:
        """Per device name, container edits to add (the MPS pipe directory and shm)."""
        if not self.switches.mps:
            return {}
        dirs = mps.claim_dirs(self.state_dir, claim_uid)
        edits: dict[str, Any] = {
            "env": [f"CUDA_MPS_PIPE_DIRECTORY={mps.CONTAINER_PIPE_DIR}"],
            "mounts": mps.mounts(dirs),
        }
        return {d.name: edits for d in mps.mps_devices(devices)}

    # --- side effects -------------------------------------------------------------------------

    def apply(self, claim_uid: str, devices: Sequence[ClaimDevice]) -> None:
        """Set the claim's intervals and start its MPS daemon; raises SharingError.

        On failure nothing stays applied that :meth:`undo` would not remove (the caller rolls
        the claim back with it).
        """
        if self.switches.time_slicing:
            for want in timeslice.wanted(devices):
                try:
                    with self._intervals:
                        self.runner.run(timeslice.set_command(want.uuid, want.interval))
                except CommandFailed as exc:
                    raise SharingError(
                        f"GPU {want.device} ({want.uuid}) refused time-slice interval "
                        f"{want.interval} (MIG mode on, or not supported by this GPU?): {exc}"
                    ) from None
        served = mps.mps_devices(devices)
        if self.switches.mps and served:
            try:
                self._mps.start(claim_uid, served)
            except mps.MpsError as exc:
                raise SharingError(str(exc)) from None

    def undo(
        self,
        claim_uid: str,
        devices: Sequence[ClaimDevice],
        others: Callable[[], Iterable[ClaimRecord]],
    ) -> None:
        """Stop the claim's daemon; reset to Default the GPUs no claim in ``others()`` (the
        other recorded claims, read under the interval lock) holds with another interval.
        Raises SharingError (the caller retries)."""
        if self.switches.mps:
            self._mps.stop(claim_uid)
        wanted = timeslice.wanted(devices) if self.switches.time_slicing else []
        if not wanted:
            return
        with self._intervals:
            still = timeslice.held(others())
            for want in wanted:
                interval = still.get(want.uuid, timeslice.DEFAULT)
                try:
                    self.runner.run(timeslice.set_command(want.uuid, interval))
                except CommandFailed as exc:
                    raise SharingError(
                        f"cannot reset time-slice interval of GPU {want.device} ({want.uuid}): "
                        f"{exc}"
                    ) from None

    def repair(
        self,
        completed: Mapping[str, tuple[ClaimRecord, Sequence[ClaimDevice]]],
        gpu_uuids: Iterable[str],
    ) -> list[str]:
        """Make the node match the completed claims (see the module docstring); returns the
        problems met (also logged), never raises."""
        problems: list[str] = []
        if self.switches.time_slicing:
            held = timeslice.held(record for record, _ in completed.values())
            for uuid in sorted({*gpu_uuids, *held}):
                try:
                    self.runner.run(timeslice.set_command(uuid, held.get(uuid, timeslice.DEFAULT)))
                except CommandFailed as exc:
                    problems.append(f"cannot set the time-slice interval of GPU {uuid}: {exc}")
        control = self._mps
        if self.switches.mps:
            wanted = {u: mps.mps_devices(d) for u, (_, d) in completed.items()}
            wanted = {u: d for u, d in wanted.items() if d}
            for uid in sorted(control.claims() - set(wanted)):
                control.stop(uid)
                log.info("stopped the MPS daemon of claim %s, which is not prepared", uid)
            for uid, devices in sorted(wanted.items()):
                if control.healthy(uid):
                    continue
                control.stop(uid)  # a dead daemon's leftovers
                try:
                    control.start(uid, devices)
                    log.warning("MPS daemon of prepared claim %s was not running: restarted", uid)
                except mps.MpsError as exc:
                    problems.append(f"cannot restart the MPS daemon of claim {uid}: {exc}")
        for problem in problems:
            log.error("%s", problem)
        return problems
