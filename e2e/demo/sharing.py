"""The demo's sharing example: a time-slice interval set on the GPU at prepare, reset after the pod.

``demo-h200``'s plugin runs with ``--time-slicing-settings=true`` (docs/concepts/sharing.md), so
prepare
sets a claim's interval on its GPU and unprepare puts the GPU back to Default. The GPUs are
simulated: the plugin records each ``nvidia-smi`` command it would run, one JSON line each, in
``sharing-commands.jsonl`` of its state directory
(``dra_gpu.prepare.sharing.runner.RecordingRunner``).
The example is the ``gpu-config`` scenario (interval Long) pinned to that node, in its own
namespace; its row shows the commands recorded while it was prepared, then its pod is deleted
and the row shows the reset. A simulated node has no kubelet to unprepare the claim when the pod
goes, so the demo calls NodeUnprepareResources as the kubelet would; on a real node the kubelet
does, and the demo waits for the reset to be recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc
from dra_gpu.prepare.sharing.applied import recording_path
from e2e import kubelet_calls
from e2e.demo import pinned
from e2e.demo import view as demo_view
from e2e.demo.env import SHARING_NODE, DemoState, NodeInfo
from e2e.suite.kube import Kube, WaitTimeout, wait_for

NAMESPACE = "demo-sharing-applied"
SCENARIO = "gpu-config"
RESET_WAIT_S = 60.0  # a real node's kubelet unprepares once the container has stopped


@dataclass(frozen=True)
class Example:
    namespace: str
    pod: str
    recorded_from: int  # size of the node's recording before the example: its commands follow


def manifests(node: str) -> list[dict[str, Any]]:
    """The scenario's claim template and pod, the pod pinned to ``node``."""
    return pinned.manifests(SCENARIO, node)


def _node(state: DemoState) -> NodeInfo:
    return next(n for n in state.nodes if n.name == SHARING_NODE)


def _recording(state: DemoState) -> Path:
    return recording_path(Path(_node(state).state_dir))


def apply(kube: Kube, state: DemoState) -> Example:
    """Create the example; what to observe, and where its recorded commands start."""
    path = _recording(state)
    start = path.stat().st_size if path.exists() else 0
    kube.create_namespace(NAMESPACE)
    pod = ""
    for doc in manifests(SHARING_NODE):
        kube.create(NAMESPACE, doc)
        pod = doc["metadata"]["name"] if doc["kind"] == "Pod" else pod
    return Example(NAMESPACE, pod, start)


def recorded(path: Path, offset: int) -> tuple[list[str], int]:
    """The commands recorded in ``path`` from byte ``offset`` on, as a shell would show them,
    and the offset after them."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
    commands = []
    for line in complete.decode().splitlines():
        entry = json.loads(line)
        stdin = str(entry.get("stdin") or "").strip()
        commands.append(" ".join(entry["argv"]) + (f" <<< {stdin!r}" if stdin else ""))
    return commands, offset + len(complete)


def _unprepare(node: NodeInfo, namespace: str, claims: Sequence[dict[str, Any]]) -> None:
    with grpc.insecure_channel(f"unix://{node.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for claim in claims:
            meta = claim["metadata"]
            ref = dra_v1_pb2.Claim(uid=meta["uid"], namespace=namespace, name=meta["name"])
            kubelet_calls.call(stub, "unprepare", ref)


def applied_and_reset(
    rows: Sequence[demo_view.Row], kube: Kube, state: DemoState, example: Example
) -> list[demo_view.Row]:
    """``rows`` with the commands recorded for the example's prepare; then the pod is deleted,
    its claims unprepared, and the reset commands are added too."""
    path, node = _recording(state), _node(state)
    applied, offset = recorded(path, example.recorded_from)
    pod = kube.pod(example.namespace, example.pod)
    claims = [
        c
        for name in demo_view.pod_claim_names(pod).values()
        if (c := kube.claim(example.namespace, name))
    ]
    # Nothing runs on a simulated node and no kubelet will confirm the pod stopped: remove it
    # at once, and unprepare as the kubelet would have.
    kube.delete_pods(example.namespace, [example.pod], grace_s=1 if node.real else 0)
    if not node.real:
        _unprepare(node, example.namespace, claims)
    try:
        reset = wait_for(
            "the reset to be recorded",
            lambda: recorded(path, offset)[0] or None,
            timeout=RESET_WAIT_S,
        )
    except WaitTimeout as exc:
        reset = [str(exc)]
    lines = [
        "prepare ran (recorded):",
        *(f"  {c}" for c in applied or ["nothing"]),
        "pod deleted, unprepare ran (recorded):",
        *(f"  {c}" for c in reset),
    ]
    return [replace(r, saw="\n".join([r.saw, *lines])) for r in rows]
