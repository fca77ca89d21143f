"""Decoding of opaque ``parameters`` into typed config, with errors users can act on.

:func:`parse_opaque_config` is the single entry point shared by the admission webhook and by
prepare, so a config the webhook admits is exactly a config prepare accepts. Its error,
:class:`ConfigError`, carries one :class:`Problem` per invalid field (a dotted path into
``parameters`` plus a reason); ``str(error)`` joins them and is meant to be shown verbatim to
the user (webhook denial message, per-claim prepare error).

Dispatch is explicit rather than a pydantic discriminated union so that an unknown
``apiVersion`` or ``kind`` gets a message naming what is accepted instead of a list of every
union member's failures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import pydantic
from pydantic_core import ErrorDetails

from dra_gpu.config import v1beta1
from dra_gpu.config.shown import shown
from dra_gpu.errors import UserError

# A map key that is safe to print as a path step (``.gpu0``); anything else is quoted
# (``["0\\n"]``) so that a newline or a 5,000-character key cannot pass for a path.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_/-]{1,64}")
# A message lists this many problems; the rest are counted (a 10 KiB config of unknown fields
# would otherwise make a message of thousands of lines).
_SHOWN_PROBLEMS: Final = 20

_KINDS: Final[dict[str, type[v1beta1.GpuConfig] | type[v1beta1.MigDeviceConfig]]] = {
    v1beta1.GPU_CONFIG_KIND: v1beta1.GpuConfig,
    v1beta1.MIG_DEVICE_CONFIG_KIND: v1beta1.MigDeviceConfig,
}


@dataclass(frozen=True)
class Problem:
    """One invalid field: ``path`` is dotted (``sharing.mpsConfig``), empty for the root."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class ConfigError(UserError, ValueError):
    """Opaque parameters that are not a valid ``resource.nvidia.com`` config."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        listed = [str(p) for p in self.problems[:_SHOWN_PROBLEMS]]
        if len(self.problems) > _SHOWN_PROBLEMS:
            listed.append(f"and {len(self.problems) - _SHOWN_PROBLEMS} more problems")
        super().__init__("; ".join(listed))


def _path(loc: Iterable[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if item == "[key]":
            continue  # pydantic's marker for "the key itself failed"; the key is already named
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not _PLAIN_KEY.fullmatch(item):
            parts.append(f"[{shown(item)}]")
        elif parts:
            parts.append(f".{item}")
        else:
            parts.append(item)
    return "".join(parts)


def _reason(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '?')}, got {shown(error['input'])}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"])


def _problem(error: ErrorDetails) -> Problem:
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    if error["type"] == "strategy_mismatch":
        # Raised by a model validator, so pydantic locates it at the model; point at the field.
        loc.append(str(ctx["field"]))
    if error["type"] == "model_type" and loc:
        return Problem(_path(loc), f"must be an object, got {type(error['input']).__name__}")
    return Problem(_path(loc), _reason(error))


def _expect_str(parameters: Mapping[str, object], field: str, accepted: Iterable[str]) -> str:
    value = parameters.get(field)
    choices = ", ".join(repr(a) for a in accepted)
    if value is None:
        raise ConfigError([Problem(field, f"required field is missing (expected {choices})")])
    if not isinstance(value, str) or value not in accepted:
        raise ConfigError(
            [Problem(field, f"unsupported value {shown(value)} (expected {choices})")]
        )
    return value


def parse_opaque_config(parameters: object) -> v1beta1.DeviceConfig:
    """Decode ``config[].opaque.parameters`` of this driver; raises :class:`ConfigError`.

    The result is as written by the user (not normalized); see :func:`v1beta1.normalized`.
    """
    if not isinstance(parameters, Mapping):
        kind = type(parameters).__name__
        raise ConfigError([Problem("", f"parameters must be an object, got {kind}")])
    _expect_str(parameters, "apiVersion", [v1beta1.API_VERSION])
    kind = _expect_str(parameters, "kind", list(_KINDS))
    try:
        return _KINDS[kind].model_validate(dict(parameters))
    except pydantic.ValidationError as exc:
        raise ConfigError(_problem(e) for e in exc.errors()) from exc
