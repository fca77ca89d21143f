"""Admission review of ResourceClaims, ResourceClaimTemplates and DeviceClasses: pure, dict in,
dict out.

:func:`review` takes an ``admission.k8s.io/v1`` AdmissionReview and returns the AdmissionReview
to send back. It never raises on bad input: a malformed review gets a refusal naming the problem.

- Refusal: every opaque config whose ``driver`` is ``gpu.nvidia.com`` must decode with
  :func:`dra_gpu.config.parse_opaque_config`, the very function prepare uses, so a claim admitted
  here cannot fail prepare on its config. The message names each bad field by its full path in
  the object (``spec.devices.config[0].opaque.parameters.sharing.strategy: ...``).
- Refusal, where the request's device type is known (its DeviceClass is ``gpu.nvidia.com`` or
  ``mig.nvidia.com``, for each subrequest of a ``firstAvailable`` request too): the config that
  would configure its devices must fit them, and a config names only requests of the claim,
  by the rule prepare uses (:mod:`dra_gpu.config.scope`): a ``MigDeviceConfig`` naming a
  request for full GPUs is refused here rather than failing the pod's prepare.
- Warnings (allowed, flagged to the user by kubectl): selectors referencing attribute or
  capacity names the driver never publishes (:mod:`selectors`), in ``exactly.selectors`` and in
  ``firstAvailable[].selectors`` (and the request-level ``selectors`` of older API versions).
- A DeviceClass has the same ``config`` and ``selectors`` entries directly in its ``spec``: an
  administrator's class with a bad GpuConfig would otherwise fail the prepare of every claim
  that uses it, long after the class was written.
- Refusal: a request of one of this driver's DeviceClasses that asks (``capacity.requests``)
  for more of a capacity than any published device of that class has can never be allocated;
  the message names the request, the amount and the most a device has (``largest``: from
  :mod:`published_capacity`, asked only for a review with such a request, since the answer
  may cost a list of every slice; None, when unknown, checks nothing).
- Configs of other drivers, deletes, other kinds, and updates that leave the device spec as it
  was (finalizer and label changes) are allowed untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from dra_gpu import DRIVER_NAME
from dra_gpu import config as gpu_config
from dra_gpu.config import scope
from dra_gpu.config.quantity import QuantityError, to_bytes
from dra_gpu.controller import published_capacity, selectors
from dra_gpu.controller.classes import GPU_CLASS, MIG_CLASS
from dra_gpu.kubeletplugin.slices import format_quantity

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
# Where the DeviceClaim (spec.devices) sits in each kind we review.
_DEVICES_PATH: Final = {
    "ResourceClaim": ("spec", "devices"),
    "ResourceClaimTemplate": ("spec", "spec", "devices"),
    "DeviceClass": ("spec",),
}
_REVIEWED_OPERATIONS: Final = frozenset({"CREATE", "UPDATE"})
# The device type of the built-in classes' devices (what their selectors select).
_CLASS_TYPES: Final[dict[str, scope.DeviceType]] = {GPU_CLASS: "gpu", MIG_CLASS: "mig"}
_CLASS_WHAT: Final = {"gpu": "full GPUs", "mig": "MIG devices"}

JSON = dict[str, Any]


def _field(obj: object, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def config_problems(devices: Mapping[str, Any], prefix: str) -> list[str]:
    """One message per invalid field of this driver's opaque configs in a DeviceClaim."""
    problems: list[str] = []
    for i, entry in enumerate(_items(devices.get("config"))):
        opaque = _field(entry, "opaque")
        if _field(opaque, "driver") != DRIVER_NAME:
            continue
        path = f"{prefix}.config[{i}].opaque.parameters"
        params = _field(opaque, "parameters")
        if not isinstance(params, Mapping):
            problems.append(f"{path}: must be an object")
            continue
        try:
            gpu_config.parse_opaque_config(params)
        except gpu_config.ConfigError as exc:
            problems.extend(f"{path}.{p}" if p.path else f"{path}: {p}" for p in exc.problems)
    return problems


def _requests(devices: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(``req`` or ``req/sub``, DeviceClass) of each request that gets devices: the request
    itself, or each subrequest of a ``firstAvailable`` one."""
    out = []
    for request in _items(devices.get("requests")):
        name = _field(request, "name")
        if not isinstance(name, str):
            continue
        subs = _items(_field(request, "firstAvailable"))
        for sub in subs:
            if isinstance(sub_name := _field(sub, "name"), str):
                out.append((f"{name}/{sub_name}", str(_field(sub, "deviceClassName") or "")))
        if not subs:
            # v1 nests the class in ``exactly``; v1beta1 has it on the request itself.
            exactly = _field(request, "exactly")
            cls = _field(exactly, "deviceClassName") or _field(request, "deviceClassName")
            out.append((name, str(cls or "")))
    return out


def scope_problems(devices: Mapping[str, Any], prefix: str) -> list[str]:
    """What prepare would refuse in the claim's configs of this driver (all of them parsed):
    a request named that the claim does not have, and, for each request of a built-in class,
    a config of the other device type that names it and would configure its devices."""
    configs = []
    for i, entry in enumerate(_items(devices.get("config"))):
        opaque = _field(entry, "opaque")
        if _field(opaque, "driver") != DRIVER_NAME:
            continue
        named = tuple(r for r in _items(_field(entry, "requests")) if isinstance(r, str))
        parsed = gpu_config.parse_opaque_config(_field(opaque, "parameters"))
        configs.append(scope.Scoped(where=f"{prefix}.config[{i}]", requests=named, config=parsed))
    requests = _requests(devices)
    known: dict[str, list[str]] = {}
    for name, _ in requests:
        main, _, sub = name.partition("/")
        known.setdefault(main, []).extend([sub] if sub else [])
    problems = [
        f"{c.where}.requests: names {', '.join(repr(u) for u in unknown)}, which the claim "
        f"does not have (its requests: {', '.join(sorted(known))})"
        for c in configs
        if known and (unknown := scope.unknown_requests(c.requests, known))
    ]
    for name, cls in requests:
        device_type = _CLASS_TYPES.get(cls)
        if device_type is None:
            continue  # another class: its devices' type is not known here
        try:
            scope.winner(
                configs,
                request=name,
                device_type=device_type,
                device=f"request {name!r}",
                which=f"whose DeviceClass {cls} gives {_CLASS_WHAT[device_type]}",
            )
        except scope.MismatchError as exc:
            problems.append(str(exc))
    return list(dict.fromkeys(problems))


def _shown(name: str, amount: int) -> str:
    if name.rpartition("/")[2] == "memory":
        return format_quantity(amount)
    return str(amount)


def _unknown() -> published_capacity.Largest | None:
    return None


def capacity_problems(
    devices: Mapping[str, Any],
    prefix: str,
    largest: Callable[[], published_capacity.Largest | None],
) -> list[str]:
    """One message per request asking more of a capacity than any published device has;
    ``largest`` is called only when a request asks for capacity."""
    asking = []
    for i, request in enumerate(_items(devices.get("requests"))):
        exactly = _field(request, "exactly")
        asked = _field(_field(exactly, "capacity"), "requests")
        ours = str(_field(exactly, "deviceClassName")) in published_capacity.CLASS_OF_TYPE.values()
        if ours and isinstance(asked, Mapping) and asked:
            asking.append((i, exactly, asked))
    known = largest() if asking else None
    if not known:
        return []
    problems = []
    for i, exactly, asked in asking:
        most = known.get(str(_field(exactly, "deviceClassName")))
        if most is None:
            continue
        for qualified, amount in asked.items():
            domain, _, name = str(qualified).rpartition("/")
            if domain not in ("", DRIVER_NAME) or name not in most:
                continue
            try:
                wanted = to_bytes(str(amount))
            except QuantityError:
                continue  # the API server's own validation refuses it
            if wanted > most[name]:
                problems.append(
                    f"{prefix}.requests[{i}].exactly.capacity.requests.{qualified}: asks "
                    f"{_shown(name, wanted)}, the most any published device of class "
                    f"{_field(exactly, 'deviceClassName')} has is {_shown(name, most[name])}: "
                    "it can never be allocated"
                )
    return problems


def _selector_lists(devices: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, list[Any]]]:
    # A DeviceClass's own selectors (a DeviceClaim has none at this level).
    yield f"{prefix}.selectors", _items(devices.get("selectors"))
    for i, request in enumerate(_items(devices.get("requests"))):
        base = f"{prefix}.requests[{i}]"
        exactly = _field(request, "exactly")
        if isinstance(exactly, Mapping):
            yield f"{base}.exactly.selectors", _items(exactly.get("selectors"))
        # Request-level selectors: the shape of resource.k8s.io/v1beta1.
        yield f"{base}.selectors", _items(_field(request, "selectors"))
        for j, sub in enumerate(_items(_field(request, "firstAvailable"))):
            yield f"{base}.firstAvailable[{j}].selectors", _items(_field(sub, "selectors"))


def selector_warnings(devices: Mapping[str, Any], prefix: str) -> list[str]:
    """One warning per unpublished name used by a selector, with the selector's path."""
    warnings: list[str] = []
    for path, entries in _selector_lists(devices, prefix):
        for k, selector in enumerate(entries):
            expression = _field(_field(selector, "cel"), "expression")
            if isinstance(expression, str):
                warnings.extend(
                    f"{path}[{k}]: {w}" for w in selectors.unknown_name_warnings(expression)
                )
    return warnings


def _devices(kind: str, obj: object) -> tuple[str, Mapping[str, Any] | None]:
    node = obj
    for key in _DEVICES_PATH[kind]:
        node = _field(node, key)
    return ".".join(_DEVICES_PATH[kind]), node if isinstance(node, Mapping) else None


def _response(uid: str, *, problems: list[str], warnings: list[str]) -> JSON:
    response: JSON = {"uid": uid, "allowed": not problems}
    if problems:
        response["status"] = {
            "code": 422,
            "reason": "Invalid",
            "message": "; ".join(problems),
        }
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


def refusal(admission_review: object, message: str) -> JSON:
    """A refusal of this review with ``message``, for reviews the webhook could not check."""
    uid = _field(_field(admission_review, "request"), "uid")
    return _response(uid if isinstance(uid, str) else "", problems=[message], warnings=[])


def review(
    admission_review: Mapping[str, Any],
    *,
    largest: Callable[[], published_capacity.Largest | None] = _unknown,
) -> JSON:
    """The AdmissionReview response for one AdmissionReview request; ``largest``: the most of
    each capacity a published device of each class has (None: not checked), asked only when
    a request asks for capacity."""
    request = _field(admission_review, "request")
    uid = _field(request, "uid")
    if not isinstance(uid, str) or not uid:
        return _response(
            "", problems=["malformed AdmissionReview: request.uid missing"], warnings=[]
        )
    kind = _field(_field(request, "kind"), "kind")
    if kind not in _DEVICES_PATH or _field(request, "operation") not in _REVIEWED_OPERATIONS:
        return _response(uid, problems=[], warnings=[])
    prefix, devices = _devices(kind, _field(request, "object"))
    if devices is None:
        return _response(uid, problems=[], warnings=[])
    if _field(request, "operation") == "UPDATE":
        _, old_devices = _devices(kind, _field(request, "oldObject"))
        if old_devices == devices:
            # Metadata-only update (a finalizer removed by the resourceclaim controller): a claim
            # admitted before this webhook existed must stay deletable, and unchanged selectors
            # were already warned about.
            return _response(uid, problems=[], warnings=[])
    # The scope is checked once every config parses (it needs them parsed).
    problems = config_problems(devices, prefix)
    if not problems and kind != "DeviceClass":
        problems = scope_problems(devices, prefix)
    problems += capacity_problems(devices, prefix, largest)
    return _response(uid, problems=problems, warnings=selector_warnings(devices, prefix))
