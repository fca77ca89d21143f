"""Real GPUs or simulated ones: decided once, here, for the whole plugin process.

Everything that differs between a node with NVIDIA GPUs and a simulated node comes from the one
:class:`Platform` that :func:`for_settings` picks from ``--simulate``:

==========================  =====================================  ===============================
what                        :class:`NvmlPlatform`                  :class:`SimulatedPlatform`
==========================  =====================================  ===============================
discovery (``backend``)     NVML under the driver root             the profile (name or file)
re-discovery (``poll``)     NVML every ``--rediscover-interval``   the profile file when it changes
the driver (``driver``)     NVML's init and versions               the profile's ``driverLoaded``
CDI node facts              driver files, MIG capability devices   ``/dev/null`` stand-ins
sharing commands            run (``nvidia-smi``, MPS control)      recorded in the state dir
dynamic MIG instances       created through NVML                   kept in the state dir
telemetry (``usage``)       NVML, processes -> pods by cgroup      the state dir's usage file
==========================  =====================================  ===============================

The callers (``main``, ``prepare_core``, ``discover_cmd``) ask the platform and never look at
``--simulate`` themselves, so a new difference is added in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from dra_gpu.devices.model import DriverStatus, GpuBackend
from dra_gpu.errors import UserError

if TYPE_CHECKING:
    from dra_gpu.devices.simulated import SimulatedBackend
    from dra_gpu.devices.usage import UsageSampler
    from dra_gpu.mig.instances import MigInstances
    from dra_gpu.prepare.node_facts import NodeFacts
    from dra_gpu.prepare.sharing.runner import Runner


class InventoryError(UserError, RuntimeError):
    """Discovery cannot run at all (bad profile, NVML missing); the message says why."""


# (NVML function, seconds, outcome), for the metrics of NVML calls.
NvmlObserver = Callable[[str, float, str], None]
# The kernel driver now; None when that cannot be told (a profile file being rewritten).
DriverProbe = Callable[[], DriverStatus | None]
NVML_CALL_TIMEOUT_S = 10.0
PROFILE_FILE_POLL_S = 1.0  # a demo or a test edits the file and expects the slices to follow


@dataclass(frozen=True)
class Rediscovery:
    """How the inventory is kept fresh: a poll every ``interval_s``, published once ``confirm``
    polls in a row agree; ``what`` names the source in log lines. ``changed_file``: discover
    again only when this file changed (a simulated profile); None: discover at every poll."""

    interval_s: float
    confirm: int
    what: str
    changed_file: Path | None = None


class Platform(Protocol):
    @property
    def simulated(self) -> bool: ...

    def backend(self, *, observe: NvmlObserver | None = None) -> GpuBackend:
        """What discovers the GPUs; raises :class:`InventoryError`."""
        ...

    def rediscovery(self, rediscover_interval_s: float | None) -> Rediscovery | None:
        """How re-discovery runs, or None when the devices cannot change."""
        ...

    def driver(self, *, observe: NvmlObserver | None = None) -> DriverProbe:
        """What looks at the kernel driver (the health monitor, every few seconds)."""
        ...

    def node_facts(self) -> NodeFacts: ...

    def runner(self, state_dir: Path) -> Runner:
        """What runs the sharing commands (time-slice intervals, MPS daemons)."""
        ...

    def mig_instances(self, state_dir: Path) -> MigInstances:
        """What creates and destroys MIG devices for ``--mig-mode=dynamic``."""
        ...

    def usage(self, state_dir: Path, *, observe: NvmlObserver | None = None) -> UsageSampler:
        """Where GPU telemetry comes from (utilization, memory, processes by pod)."""
        ...


@dataclass(frozen=True)
class NvmlPlatform:
    """A node with NVIDIA GPUs. ``host_driver_root``: the driver root as the container runtime
    sees it, when the plugin sees it at ``driver_root``."""

    driver_root: Path
    host_driver_root: PurePosixPath | None = None
    nvml_timeout_s: float = NVML_CALL_TIMEOUT_S
    # Where the GPU processes' /proc entries are: the host's PIDs, as NVML reports them, are
    # visible when the plugin shares the host's PID namespace (the chart's hostPID).
    proc_root: Path = Path("/proc")

    @property
    def simulated(self) -> bool:
        return False

    def backend(self, *, observe: NvmlObserver | None = None) -> GpuBackend:
        from dra_gpu.devices import nvml  # pynvml only on real nodes

        return nvml.NvmlBackend(
            driver_root=self.driver_root, call_timeout_s=self.nvml_timeout_s, observe=observe
        )

    def driver(self, *, observe: NvmlObserver | None = None) -> DriverProbe:
        from dra_gpu.devices import nvml

        # A backend of its own: a look at the driver never waits behind a discovery pass.
        return nvml.NvmlBackend(
            driver_root=self.driver_root, call_timeout_s=self.nvml_timeout_s, observe=observe
        ).driver_status

    def rediscovery(self, rediscover_interval_s: float | None) -> Rediscovery | None:
        if not rediscover_interval_s:
            return None
        # Two discoveries in a row must agree: one failed NVML call must not take devices
        # out and put them back a minute later.
        return Rediscovery(interval_s=rediscover_interval_s, confirm=2, what="NVML inventory")

    def node_facts(self) -> NodeFacts:
        from dra_gpu.prepare import node_facts

        return node_facts.HostNode(
            driver_root=self.driver_root, host_driver_root=self.host_driver_root
        )

    def runner(self, state_dir: Path) -> Runner:
        from dra_gpu.prepare.sharing.runner import ProcessRunner

        return ProcessRunner(self.driver_root)

    def mig_instances(self, state_dir: Path) -> MigInstances:
        from dra_gpu.devices.nvml import NvmlBackend
        from dra_gpu.mig.nvml_instances import NvmlInstances

        return NvmlInstances(NvmlBackend(driver_root=self.driver_root))

    def usage(self, state_dir: Path, *, observe: NvmlObserver | None = None) -> UsageSampler:
        from dra_gpu.devices.nvml_usage import NvmlUsageSampler

        return NvmlUsageSampler(
            driver_root=self.driver_root,
            proc_root=self.proc_root,
            call_timeout_s=self.nvml_timeout_s,
            observe=observe,
        )


@dataclass(frozen=True)
class SimulatedPlatform:
    """Simulated GPUs from ``profile``: a built-in profile's name or a profile file."""

    profile: str
    node_name: str

    @property
    def simulated(self) -> bool:
        return True

    @property
    def profile_file(self) -> Path | None:
        """The file behind the profile, or None for a built-in one."""
        from dra_gpu.devices import simulated

        return None if self.profile in simulated.BUILTIN_PROFILES else Path(self.profile)

    def backend(self, *, observe: NvmlObserver | None = None) -> GpuBackend:
        return self._backend()

    def _backend(self) -> SimulatedBackend:
        from dra_gpu.devices import profiles, simulated

        try:
            profile = profiles.resolve_profile(self.profile)
        except simulated.ProfileError as err:
            raise InventoryError(str(err)) from err
        return simulated.SimulatedBackend(profile=profile, node_name=self.node_name)

    def driver(self, *, observe: NvmlObserver | None = None) -> DriverProbe:
        """The profile's driver, read again at each look (a test or the demo rewrites the file
        to unload the driver and load another version)."""

        def status() -> DriverStatus | None:
            try:
                backend = self._backend()
            except InventoryError:  # a file half written, or broken: no news of the driver
                return None
            return backend.driver_status()

        return status

    def rediscovery(self, rediscover_interval_s: float | None) -> Rediscovery | None:
        path = self.profile_file
        if path is None:
            return None  # a built-in profile never changes
        return Rediscovery(
            interval_s=PROFILE_FILE_POLL_S,
            confirm=1,
            what=f"simulated profile {path}",
            changed_file=path,
        )

    def node_facts(self) -> NodeFacts:
        from dra_gpu.prepare import node_facts

        return node_facts.simulated

    def runner(self, state_dir: Path) -> Runner:
        from dra_gpu.prepare.sharing.applied import recording_path
        from dra_gpu.prepare.sharing.runner import RecordingRunner

        return RecordingRunner(recording_path(state_dir))

    def mig_instances(self, state_dir: Path) -> MigInstances:
        from dra_gpu.mig.dynamic import SIMULATED_STATE_NAME
        from dra_gpu.mig.instances import SimulatedInstances

        return SimulatedInstances(state_dir / SIMULATED_STATE_NAME, node_name=self.node_name)

    def usage(self, state_dir: Path, *, observe: NvmlObserver | None = None) -> UsageSampler:
        from dra_gpu.devices.simulated_usage import FILE_NAME, SimulatedUsageSampler

        return SimulatedUsageSampler(state_dir / FILE_NAME)


def for_node(
    *,
    simulate: str | None,
    node_name: str,
    driver_root: Path = Path("/"),
    host_driver_root: PurePosixPath | None = None,
    nvml_timeout_s: float = NVML_CALL_TIMEOUT_S,
) -> Platform:
    """The platform of this process: simulated with ``--simulate PROFILE``, else NVML."""
    if simulate is not None:
        return SimulatedPlatform(profile=simulate, node_name=node_name)
    return NvmlPlatform(
        driver_root=driver_root, host_driver_root=host_driver_root, nvml_timeout_s=nvml_timeout_s
    )
