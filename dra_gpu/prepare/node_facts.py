"""What a claim's CDI spec needs to know of the node: given to prepare as a provider.

A provider maps the devices of one claim to the node facts (``cdi.Node``) their spec is built
from. :func:`simulated` is a node without GPUs (device nodes stood in by ``/dev/null``);
:class:`HostNode` reads a real node with the NVIDIA driver (driver files once, MIG capability
devices per claim).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath

from dra_gpu.prepare import cdi, cdi_host

NodeFacts = Callable[[Sequence[cdi.ClaimDevice]], cdi.Node]


def simulated(devices: Sequence[cdi.ClaimDevice]) -> cdi.Node:
    return cdi.SimulatedNode()


class HostNode:
    """The facts of this real node. ``host_driver_root``: the driver root as the container
    runtime sees it, when the plugin sees it elsewhere (``driver_root``)."""

    def __init__(
        self,
        *,
        driver_root: Path,
        host_driver_root: PurePosixPath | None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self._driver_root = driver_root
        self._host_driver_root = host_driver_root
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._base: cdi.RealNode | None = None

    def __call__(self, devices: Sequence[cdi.ClaimDevice]) -> cdi.Node:
        with self._lock:
            if self._base is None:
                # Driver files and the device root do not change while the plugin runs.
                self._base = cdi_host.read_real_node(
                    driver_root=self._driver_root, host_driver_root=self._host_driver_root
                )
            base = self._base
        migs = [(d.minor, d.gi_id or 0, d.ci_id or 0) for d in devices if d.type == "mig"]
        if not migs:
            return base
        return replace(base, mig_caps=cdi_host.mig_caps(self._proc_root, migs))
