"""Start a ``NodePlugin`` in unit tests as ``lifecycle`` does, with a fake or a real driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_gpu.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.plugin import node_plugin
from dra_gpu.prepare.state import DeviceState


class EmptyDriver:
    """Stands in for the prepare side: answers every call with no claims."""

    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]:
        return {}

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]:
        return {}


def start_serving(plugin: node_plugin.NodePlugin, state: DeviceState | None = None) -> None:
    """Publish, restore ``state`` under the node-wide lock, then serve it (else
    :class:`EmptyDriver`)."""
    plugin.start_publishing()
    if state is not None:
        with plugin.exclusive():
            state.start()
    plugin.serve(state or EmptyDriver())
