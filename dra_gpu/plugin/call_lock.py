"""One DRA call at a time on a node, across every instance of the plugin (rolling update).

During a rolling update two plugin instances serve the same node; the kubelet may send
prepare to one and unprepare to the other. A ``flock`` on a file in the plugin data directory,
which both instances share, serializes those calls (:func:`held`, i.e.
:func:`dra_gpu.plugin.atomicfile.locked`, which also serializes threads of one process).

The lock is held by ``state.DeviceState`` around each call's transaction (``main.device_state``
gives it this one in rolling-update mode); the claims are read from the API before it.
"""

from __future__ import annotations

from dra_gpu.plugin.atomicfile import locked as held

__all__ = ["held"]
