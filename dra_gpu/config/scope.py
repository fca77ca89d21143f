"""Which of a claim's configs configures a device, and whether it fits: one rule for prepare and
the admission webhook (pure).

A config names requests in ``requests`` (``req``, or ``req/sub`` for a subrequest of a
``firstAvailable`` request; ``req`` covers all of its subrequests), or none: then it is
claim-wide. For one device, allocated for request ``request`` (``req`` or ``req/sub``), the
configs are looked at from the last (the caller orders them: class configs first, then the
claim's, each in listed order):

- a config that does not name the request (nor its main request) is skipped;
- a config of the device's kind (``GpuConfig`` for a full GPU, ``MigDeviceConfig`` for a MIG
  device) wins;
- a claim-wide config of the other kind is passed over: a claim with a full GPU and a MIG
  device may carry one claim-wide ``GpuConfig``, and the MIG device gets its default;
- a config of the other kind that names the request is an error (:class:`MismatchError`): the
  user wrote it for this request, and dropping it without a word would run the workload with
  a setting it did not ask for.

This is NVIDIA's rule, with the subrequest forms of the Kubernetes API (NVIDIA's driver matches
only the exact result name). A config that names a request the claim does not have is an error
too (:func:`unknown_requests`): the API server refuses such claims, so only a claim that reached
the driver by another way has one, and a misspelled name must not leave its config unused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from dra_gpu.config.v1beta1 import DeviceConfig, GpuConfig, MigDeviceConfig
from dra_gpu.errors import UserError

DeviceType = Literal["gpu", "mig"]
_KIND: Final[dict[str, type[GpuConfig] | type[MigDeviceConfig]]] = {
    "gpu": GpuConfig,
    "mig": MigDeviceConfig,
}
_WHAT: Final = {"gpu": "a full GPU", "mig": "a MIG device"}
_OTHERS: Final = {"gpu": "MIG devices", "mig": "full GPUs"}


class MismatchError(UserError):
    """A config of the wrong kind names the device's request; the message says which and why."""


@dataclass(frozen=True)
class Scoped:
    """A parsed config and the requests it names (empty: the whole claim)."""

    where: str  # "config[2] (FromClaim)", for messages
    requests: tuple[str, ...]
    config: DeviceConfig


def main_request(request: str) -> str:
    """``req`` of ``req/sub``; a request without subrequests is its own."""
    return request.split("/", 1)[0]


def names(scoped: Scoped, request: str) -> bool:
    """The config names ``request``, or the main request of subrequest ``request``."""
    return request in scoped.requests or main_request(request) in scoped.requests


def winner(
    configs: Sequence[Scoped],
    *,
    request: str,
    device_type: DeviceType,
    device: str,
    which: str | None = None,
) -> Scoped | None:
    """The config that configures a device of ``device_type`` allocated for ``request``; None:
    the type's default. In the error, ``device`` names it (``gpu-0``) and ``which`` says what it
    is (default: ``which is a full GPU`` or ``which is a MIG device``)."""
    wanted = _KIND[device_type]
    for scoped in reversed(configs):
        if scoped.requests and not names(scoped, request):
            continue
        if isinstance(scoped.config, wanted):
            return scoped
        if not scoped.requests:
            continue  # claim-wide: meant for the claim's devices of the other type
        raise MismatchError(
            f"{scoped.where}: a {scoped.config.kind} cannot configure {device}, "
            f"{which or 'which is ' + _WHAT[device_type]} (use {wanted.__name__}, or name only "
            "requests for "
            f"{_OTHERS[device_type]} in this config)"
        )
    return None


def unknown_requests(named: Iterable[str], requests: Mapping[str, Sequence[str]]) -> list[str]:
    """The names in ``named`` that are neither a request of the claim nor ``req/sub`` of one of
    its subrequests; ``requests`` maps each request's name to its subrequests' names."""
    unknown = []
    for name in named:
        main, _, sub = name.partition("/")
        subs = requests.get(main)
        if subs is None or (sub and sub not in subs):
            unknown.append(name)
    return unknown
