"""Fault injection for crash tests: die with SIGKILL right after a named step.

The process main passes ``from_env(os.environ)`` to :class:`dra_gpu.plugin.state.DeviceState`
as its ``fault`` collaborator. With ``DRA_GPU_FAULT=<step>`` (one of ``state.FAULT_STEPS`` or
``state.MIG_FAULT_STEPS``) the plugin kills itself the first time it reaches that step, exactly
as an OOM kill or a node problem would, so tests can check what a restart recovers. Unset: a no-op.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping

from dra_gpu.plugin.state import FAULT_STEPS, MIG_FAULT_STEPS

ENV_VAR = "DRA_GPU_FAULT"
log = logging.getLogger(__name__)


def _none(step: str) -> None:
    return None


def kill_at(target: str) -> Callable[[str], None]:
    """A fault function that SIGKILLs this process when ``step == target``."""
    steps = (*FAULT_STEPS, *MIG_FAULT_STEPS)
    if target not in steps:
        raise ValueError(f"{ENV_VAR}={target!r} is not a step: {', '.join(steps)}")

    def fault(step: str) -> None:
        if step == target:
            log.warning("fault injection: SIGKILL at %s", step)
            os.kill(os.getpid(), signal.SIGKILL)

    return fault


def from_env(env: Mapping[str, str]) -> Callable[[str], None]:
    target = env.get(ENV_VAR, "")
    return kill_at(target) if target else _none
