"""The project's error base: user-facing errors are ``UserError``, the checkpoint's are internal.

Prepare shows a ``UserError``'s message to the user as it is (the pod's events) and anything
else as an internal error; each error keeps its standard base, so ``except ValueError`` and the
like still catch it.
"""

from __future__ import annotations

import pytest

from dra_gpu.config.parsing import ConfigError
from dra_gpu.controller.classfile import ClassesFileError
from dra_gpu.devices.health_rules import HealthConfigError
from dra_gpu.devices.simulated import ProfileError
from dra_gpu.errors import InternalError, UserError
from dra_gpu.plugin.inventory import InventoryError
from dra_gpu.plugin.settings import SettingsError
from dra_gpu.prepare.cdi import CDIError
from dra_gpu.prepare.checkpoint import CheckpointCorrupt, CheckpointError, CheckpointTooNew
from dra_gpu.prepare.plan import PlanError


@pytest.mark.parametrize(
    ("error", "standard"),
    [
        (ConfigError, ValueError),
        (PlanError, Exception),
        (CDIError, RuntimeError),
        (SettingsError, ValueError),
        (InventoryError, RuntimeError),
        (HealthConfigError, ValueError),
        (ProfileError, ValueError),
        (ClassesFileError, ValueError),
    ],
)
def test_user_facing_errors(error: type[Exception], standard: type[Exception]) -> None:
    assert issubclass(error, UserError) and issubclass(error, standard)
    assert not issubclass(error, InternalError)


@pytest.mark.parametrize("error", [CheckpointError, CheckpointCorrupt, CheckpointTooNew])
def test_checkpoint_errors_are_internal(error: type[Exception]) -> None:
    assert issubclass(error, InternalError) and issubclass(error, RuntimeError)
    assert not issubclass(error, UserError)
