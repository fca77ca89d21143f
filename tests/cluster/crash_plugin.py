"""``python tests/cluster/crash_plugin.py STEP ARGS...``: ``dra-gpu ARGS...`` that SIGKILLs itself
the first time prepare or unprepare reaches STEP (``state.FAULT_STEPS``,
``SIDE_EFFECT_FAULT_STEPS``, ``MIG_FAULT_STEPS``).

The crash tests start the plugin through this instead of ``python -m dra_gpu``, so the shipped
program has no failpoints: the step is installed here, as the ``fault`` collaborator of the
prepare core the real main builds, exactly as an OOM kill or a node problem would stop it.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from dra_gpu import cli
from dra_gpu.plugin import prepare_core
from dra_gpu.prepare.state import (
    FAULT_STEPS,
    MIG_FAULT_STEPS,
    SIDE_EFFECT_FAULT_STEPS,
    DeviceState,
)

log = logging.getLogger("crash_plugin")


def kill_at(target: str) -> Callable[[str], None]:
    """A fault function that SIGKILLs this process when ``step == target``."""
    steps = (*FAULT_STEPS, *SIDE_EFFECT_FAULT_STEPS, *MIG_FAULT_STEPS)
    if target not in steps:
        raise ValueError(f"{target!r} is not a step: {', '.join(steps)}")

    def fault(step: str) -> None:
        if step == target:
            log.warning("fault injection: SIGKILL at %s", step)
            os.kill(os.getpid(), signal.SIGKILL)

    return fault


def main(argv: Sequence[str]) -> int:
    step, *rest = argv
    # The prepare core the real main builds (``prepare_core.make_state``) gets the failpoint.
    vars(prepare_core)["DeviceState"] = functools.partial(DeviceState, fault=kill_at(step))
    return cli.main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
