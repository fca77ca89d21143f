"""The prepare core of this node (:class:`DeviceState`), built from the plugin's settings.

Built by the process main, outside the gRPC adapter: the kit's DRA service only gets the
finished object (as a :class:`dra_gpu.kubeletplugin.driver.Driver`), and the main restores it
(``DeviceState.start``) under the node-wide lock before serving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dra_gpu.devices.model import Device
from dra_gpu.kube.client import KubeClient
from dra_gpu.kubeletplugin import events
from dra_gpu.kubeletplugin.events import EventPoster
from dra_gpu.plugin.platforms import Platform
from dra_gpu.prepare import claims
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.state import CallLock, DeviceState, DriverGate, StateSettings

if TYPE_CHECKING:
    from dra_gpu.mig.dynamic import DynamicMig


def make_state(
    *,
    driver_name: str,
    node_name: str,
    cdi_root: Path,
    state_dir: Path,
    platform: Platform,
    inventory: Callable[[], Mapping[str, Device]],
    client: KubeClient,
    poster: EventPoster,
    call_lock: CallLock,
    sharing: Switches,
    mig: DynamicMig | None = None,
    driver_gate: DriverGate | None = None,
) -> DeviceState:
    """The prepare handler as the plugin process runs it: claims read from the API server,
    node warnings posted as Events by ``poster``.

    ``sharing``: which strategies are applied to the GPUs; what runs their commands (or records
    them, on a simulated node) and the CDI spec's node facts come from ``platform``.
    """
    return DeviceState(
        settings=StateSettings(
            driver_name=driver_name,
            node_name=node_name,
            cdi_root=cdi_root,
            state_dir=state_dir,
        ),
        inventory=inventory,
        claims=claims.KubeClaimFetcher(client),
        node_facts=platform.node_facts(),
        report=claims.NodeEventReporter(
            poster, node_name=node_name, source=events.component(driver_name)
        ),
        call_lock=call_lock,
        sharing=Sharing(runner=platform.runner(state_dir), state_dir=state_dir, switches=sharing),
        mig=mig,
        driver_gate=driver_gate or (lambda: None),
    )
