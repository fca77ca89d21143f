"""Calling a kubelet plugin the way the kubelet does, for nodes that have no kubelet.

``prepare`` sends one ``NodePrepareResources`` (DRA v1) over the plugin's unix socket with the
claims of one pod, and returns per claim UID either the prepared devices or the per-claim error.
``read_cdi_specs`` loads the CDI specs of a CDI directory, which is what a container runtime reads
to turn the returned CDI device IDs into container edits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc

# The kubelet's own limit for one call.
TIMEOUT_S = 45.0


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


def prepare(
    socket: Path, claims: Sequence[tuple[str, str, str]]
) -> dict[str, list[PreparedDevice] | str]:
    """NodePrepareResources for ``(namespace, uid, name)`` claims: uid -> devices or error."""
    if not claims:
        return {}
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
    )
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        response = stub.NodePrepareResources(request, timeout=TIMEOUT_S)
    result: dict[str, list[PreparedDevice] | str] = {}
    for uid, answer in response.claims.items():
        if answer.error:
            result[uid] = answer.error
            continue
        result[uid] = [
            PreparedDevice(
                request_names=tuple(d.request_names),
                pool=d.pool_name,
                device=d.device_name,
                cdi_device_ids=tuple(d.cdi_device_ids),
            )
            for d in answer.devices
        ]
    return result


def read_cdi_specs(cdi_root: Path) -> list[dict[str, Any]]:
    """Every ``.json`` / ``.yaml`` CDI spec in ``cdi_root`` (unreadable files are skipped)."""
    specs: list[dict[str, Any]] = []
    for path in sorted(cdi_root.glob("*")):
        try:
            if path.suffix == ".json":
                specs.append(json.loads(path.read_text()))
            elif path.suffix in (".yaml", ".yml"):
                specs.append(yaml.safe_load(path.read_text()))
        except (OSError, ValueError, yaml.YAMLError):
            continue
    return specs
