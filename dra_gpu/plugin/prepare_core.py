"""The prepare core of this node (:class:`DeviceState`), built from the plugin's settings.

Built by the process main, outside the gRPC adapter: the kit's DRA service only gets the
finished object (as a :class:`dra_gpu.kubeletplugin.driver.Driver`), and the main restores it
(``DeviceState.start``) under the node-wide lock before serving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from dra_gpu.devices.model import Device
from dra_gpu.kube.client import KubeClient
from dra_gpu.prepare import claims, node_facts
from dra_gpu.prepare.sharing.applied import Sharing, Switches, recording_path
from dra_gpu.prepare.sharing.runner import ProcessRunner, RecordingRunner, Runner
from dra_gpu.prepare.state import CallLock, DeviceState, StateSettings

if TYPE_CHECKING:
    from dra_gpu.mig.dynamic import DynamicMig


def make_state(
    *,
    driver_name: str,
    node_name: str,
    cdi_root: Path,
    state_dir: Path,
    simulated: bool,
    driver_root: Path,
    host_driver_root: PurePosixPath | None,
    inventory: Callable[[], Mapping[str, Device]],
    client: KubeClient,
    call_lock: CallLock,
    sharing: Switches,
    mig: DynamicMig | None = None,
) -> DeviceState:
    """The prepare handler as the plugin process runs it: claims read from the API server,
    node warnings posted as Events.

    ``sharing``: which strategies are applied to the GPUs; simulated nodes record the commands
    in the state dir (``sharing.applied.recording_path``) instead of running them.
    """
    runner: Runner = (
        RecordingRunner(recording_path(state_dir)) if simulated else ProcessRunner(driver_root)
    )
    return DeviceState(
        settings=StateSettings(
            driver_name=driver_name,
            node_name=node_name,
            cdi_root=cdi_root,
            state_dir=state_dir,
        ),
        inventory=inventory,
        claims=claims.KubeClaimFetcher(client),
        node_facts=(
            node_facts.simulated
            if simulated
            else node_facts.HostNode(driver_root=driver_root, host_driver_root=host_driver_root)
        ),
        report=claims.NodeEventReporter(client, node_name=node_name),
        call_lock=call_lock,
        sharing=Sharing(runner=runner, state_dir=state_dir, switches=sharing),
        mig=mig,
    )
