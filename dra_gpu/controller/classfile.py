"""The administrators' classes file: extra DeviceClasses the controller keeps applied.

Format (YAML)::

    # Optional: extendedResourceName of the built-in gpu.nvidia.com class (overrides the flag).
    extendedResourceName: nvidia.com/gpu
    classes:
      - name: h200.nvidia.com          # DeviceClass name (DNS subdomain)
        deviceType: gpu                # gpu (default) or mig: only this driver's devices of it
        productName: NVIDIA H200       # shorthand: exact productName
        minMemory: 80Gi                # shorthand: memory capacity at least this quantity
        selectors:                     # more CEL expressions; a device must match all of them
          - "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'"
        config:                        # opaque configs for this driver, checked like claims' ones
          - {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,
             sharing: {strategy: TimeSlicing}}
        extendedResourceName: example.com/h200

Every class gets the driver and type selector first, so an administrator's class can never
select another driver's devices. Parsing never fails on one bad class: that class is skipped
and reported, the others are kept. Only a file that is not a mapping at all (or unreadable YAML)
is an error as a whole, and then the caller keeps the last good state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import pydantic
import yaml

from dra_gpu import DRIVER_NAME
from dra_gpu import config as gpu_config
from dra_gpu.config import quantity
from dra_gpu.controller import classes, selectors
from dra_gpu.errors import UserError

_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_CONFIG_KIND: Final = {"gpu": gpu_config.GPU_CONFIG_KIND, "mig": gpu_config.MIG_DEVICE_CONFIG_KIND}


class ClassesFileError(UserError, ValueError):
    """The file as a whole cannot be used (not YAML, not a mapping, unknown top-level keys)."""


class _Entry(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = pydantic.Field(max_length=253)
    deviceType: Literal["gpu", "mig"] = "gpu"
    productName: str | None = None
    minMemory: str | None = None
    selectors: list[str] = []
    config: list[dict[str, Any]] = []
    extendedResourceName: str | None = None


class _File(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    extendedResourceName: str | None = None
    classes: list[Any] = []


@dataclass(frozen=True)
class ClassesFile:
    """What a classes file asks for; ``problems`` lists the entries that were skipped."""

    extended_resource_name: str | None
    classes: tuple[classes.DesiredClass, ...]
    problems: tuple[str, ...]
    warnings: tuple[str, ...]


def _cel_string(text: str) -> str:
    # JSON string escapes are valid CEL string escapes for everything json.dumps emits.
    return json.dumps(text)


def _expressions(entry: _Entry) -> list[str]:
    exprs = [classes.type_selector(entry.deviceType)]
    attrs = f"device.attributes['{DRIVER_NAME}']"
    if entry.productName is not None:
        exprs.append(f"{attrs}.productName == {_cel_string(entry.productName)}")
    if entry.minMemory is not None:
        exprs.append(
            f"device.capacity['{DRIVER_NAME}'].memory"
            f".compareTo(quantity({_cel_string(entry.minMemory)})) >= 0"
        )
    return exprs + list(entry.selectors)


def _check_entry(entry: _Entry) -> list[str]:
    problems: list[str] = []
    if not _DNS_SUBDOMAIN.match(entry.name):
        problems.append("name: must be a lowercase DNS subdomain")
    if entry.name in classes.BUILTIN_NAMES:
        problems.append("name: is a built-in class of the driver")
    if entry.minMemory is not None:
        try:
            quantity.to_decimal(entry.minMemory)
        except quantity.QuantityError as exc:
            problems.append(f"minMemory: {exc}")
    for i, params in enumerate(entry.config):
        try:
            gpu_config.parse_opaque_config(params)
        except gpu_config.ConfigError as exc:
            problems.extend(
                f"config[{i}].{p}" if p.path else f"config[{i}]: {p}" for p in exc.problems
            )
            continue
        if params.get("kind") != _CONFIG_KIND[entry.deviceType]:
            problems.append(
                f"config[{i}].kind: a {entry.deviceType} class takes "
                f"{_CONFIG_KIND[entry.deviceType]}, got {params.get('kind')!r}"
            )
    return problems


def _desired(entry: _Entry, origin: str) -> classes.DesiredClass:
    spec: dict[str, Any] = {"selectors": classes.cel_selectors(_expressions(entry))}
    if entry.config:
        spec["config"] = [
            {"opaque": {"driver": DRIVER_NAME, "parameters": p}} for p in entry.config
        ]
    if entry.extendedResourceName:
        spec["extendedResourceName"] = entry.extendedResourceName
    return classes.DesiredClass(entry.name, spec, origin)


def _entry_label(index: int, raw: object) -> str:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    return f"classes[{index}]" + (f" ({name})" if isinstance(name, str) else "")


def _validation_problems(exc: pydantic.ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        reason = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        out.append(f"{loc}: {reason}" if loc else reason)
    return out


def parse_classes_file(text: str, *, source: str = "classes file") -> ClassesFile:
    """Parse the file's text; raises :class:`ClassesFileError` only for a wholly unusable file."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClassesFileError(f"{source}: not valid YAML: {exc}") from exc
    try:
        top = _File.model_validate(raw if raw is not None else {})
    except pydantic.ValidationError as exc:
        raise ClassesFileError(f"{source}: " + "; ".join(_validation_problems(exc))) from exc
    desired: list[classes.DesiredClass] = []
    problems: list[str] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for i, raw_entry in enumerate(top.classes):
        label = _entry_label(i, raw_entry)
        try:
            entry = _Entry.model_validate(raw_entry)
        except pydantic.ValidationError as exc:
            problems.extend(f"{label}: {p}" for p in _validation_problems(exc))
            continue
        entry_problems = _check_entry(entry)
        if entry.name in seen:
            entry_problems.append("name: defined twice; the first definition is kept")
        if entry_problems:
            problems.extend(f"{label}: {p}" for p in entry_problems)
            continue
        seen.add(entry.name)
        for j, expr in enumerate(entry.selectors):
            warnings.extend(
                f"{label}.selectors[{j}]: {w}" for w in selectors.unknown_name_warnings(expr)
            )
        desired.append(_desired(entry, f"{source} {label}"))
    return ClassesFile(top.extendedResourceName, tuple(desired), tuple(problems), tuple(warnings))


def desired_classes(
    *, flag_extended_resource_name: str | None, file: ClassesFile | None
) -> Sequence[classes.DesiredClass]:
    """Built-in classes plus the file's; the file's extendedResourceName overrides the flag."""
    ern = flag_extended_resource_name
    if file is not None and file.extended_resource_name is not None:
        ern = file.extended_resource_name or None
    builtin = classes.builtin_classes(extended_resource_name=ern)
    return (*builtin, *(file.classes if file is not None else ()))
