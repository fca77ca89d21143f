"""The kubelet's DRAPlugin services (v1 and v1beta1) over a :class:`Driver`, as a method table:
the one pipeline every prepare and unprepare goes through.

A call: the request's claims (deduplicated, incomplete ones refused), the driver called once,
then the steps in order over its typed results (metrics, failure Events, device status: each
queues its own I/O, see ``driver.Step``), then the response. Every claim of a request gets an
entry in the response; a claim's failure is its ``error`` (the kubelet then ignores its
devices), never a gRPC error for the whole call, not even when the driver raises (a bug: each
claim then fails with it). ``share_id`` exists only in v1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from dra_gpu.kubeletplugin.driver import ClaimRef, Driver, PrepareResult, Step
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.kubeletplugin.rpc_methods import CallContext, Method, serialize_message
from dra_gpu.pb import dra_v1_pb2, dra_v1beta1_pb2

log = logging.getLogger(__name__)


def _refs(claims_in: Any) -> tuple[list[ClaimRef], dict[str, str]]:
    """Claims from a request, deduplicated; plus errors for claims missing required fields."""
    refs: dict[str, ClaimRef] = {}
    invalid: dict[str, str] = {}
    for claim in claims_in:
        if not (claim.uid and claim.namespace and claim.name):
            invalid[claim.uid] = (
                f"claim {claim.namespace}/{claim.name} ({claim.uid}): "
                "uid, namespace and name are all required"
            )
            continue
        refs.setdefault(
            claim.uid, ClaimRef(uid=ClaimUID(claim.uid), namespace=claim.namespace, name=claim.name)
        )
    return list(refs.values()), invalid


def _valid_refs(claims_in: Any, response: Any) -> list[ClaimRef]:
    """The request's valid claims; each invalid one gets its error in ``response`` at once."""
    refs, invalid = _refs(claims_in)
    for uid, message in invalid.items():
        response.claims[uid].error = message
    return refs


def _methods(
    driver: Driver, steps: Sequence[Step], pb: ModuleType, service: str, *, share_id: bool
) -> list[Method]:
    def prepare(request: Any, context: CallContext) -> Any:
        response = pb.NodePrepareResourcesResponse()
        refs = _valid_refs(request.claims, response)
        for step in steps:
            step.started("prepare")
        start = time.perf_counter()
        try:
            results = driver.prepare(refs)
        except Exception as exc:
            log.exception("prepare of %d claim(s) failed unexpectedly", len(refs))
            error = f"prepare: internal error: {type(exc).__name__}: {exc}"
            results = {r.uid: PrepareResult(error=error, kind="Unexpected") for r in refs}
        seconds = time.perf_counter() - start
        for step in steps:
            step.prepared(refs, results, seconds)
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for device in result.devices:
                out = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if share_id and device.share_id:
                    out.share_id = device.share_id
        return response

    def unprepare(request: Any, context: CallContext) -> Any:
        response = pb.NodeUnprepareResourcesResponse()
        refs = _valid_refs(request.claims, response)
        for step in steps:
            step.started("unprepare")
        start = time.perf_counter()
        try:
            errors = driver.unprepare(refs)
        except Exception as exc:
            log.exception("unprepare of %d claim(s) failed unexpectedly", len(refs))
            error = f"unprepare: internal error: {type(exc).__name__}: {exc}"
            errors = {r.uid: error for r in refs}
        seconds = time.perf_counter() - start
        for step in steps:
            step.unprepared(refs, errors, seconds)
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response

    return [
        Method(
            f"/{service}/NodePrepareResources",
            pb.NodePrepareResourcesRequest.FromString,
            prepare,
            serialize_message,
        ),
        Method(
            f"/{service}/NodeUnprepareResources",
            pb.NodeUnprepareResourcesRequest.FromString,
            unprepare,
            serialize_message,
        ),
    ]


def methods(driver: Driver, steps: Sequence[Step] = ()) -> list[Method]:
    """DRAPlugin v1 and v1beta1, both served by ``driver``, each call followed by ``steps``."""
    v1, v1beta1 = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    return [
        *_methods(driver, steps, dra_v1_pb2, v1, share_id=True),
        *_methods(driver, steps, dra_v1beta1_pb2, f"{v1beta1}.DRAPlugin", share_id=False),
    ]
