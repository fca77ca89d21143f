"""The demo's table: pod → claim → node → device → what the container saw (pure functions).

"What the container saw" has two sources, rendered the same way:

- on a real node, the container's own report in its log (``e2e.suite.views.parse_report``);
- on a simulated node (no kubelet, so no container), the CDI edits the container *would* get:
  the demo calls NodePrepareResources like the kubelet, and resolves the returned CDI device IDs
  in the plugin's CDI directory (``cdi_view``), exactly as the runtime would.

Either way the result is a ``ContainerView`` (environment + device node paths), summarised per
device from the ``GPU_DEVICE_<key>*`` variables the driver's CDI specs set.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu.prepare.cdi import env_prefix
from e2e.suite.views import ContainerView
from e2e.suite.views import pod_claim_names as pod_claim_names  # re-exported for e2e.demo


def container_claims(container: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(pod-level claim name, request or None) for each claim a container uses."""
    refs = (container.get("resources") or {}).get("claims") or []
    return [(str(r["name"]), r.get("request")) for r in refs]


def cdi_view(specs: Iterable[Mapping[str, Any]], device_ids: Sequence[str]) -> ContainerView:
    """The env and device nodes a runtime applies for ``device_ids`` (``kind=name``).

    Spec-level edits apply once if any device of that spec is used; device edits per device.
    An ID that no spec defines is an error, as it is for the runtime.
    """
    env: dict[str, str] = {}
    paths: set[str] = set()

    def apply(edits: Mapping[str, Any]) -> None:
        for entry in edits.get("env") or []:
            key, _, value = str(entry).partition("=")
            env[key] = value
        paths.update(str(node["path"]) for node in edits.get("deviceNodes") or [])

    wanted = list(device_ids)
    found: set[str] = set()
    for spec in specs:
        kind = spec.get("kind")
        names = {f"{kind}={d['name']}": d for d in spec.get("devices") or []}
        used = [i for i in wanted if i in names]
        if not used:
            continue
        apply(spec.get("containerEdits") or {})
        for device_id in used:
            apply(names[device_id].get("containerEdits") or {})
            found.add(device_id)
    missing = [i for i in wanted if i not in found]
    if missing:
        raise ValueError(f"no CDI spec defines {', '.join(missing)}")
    return ContainerView(env=env, device_paths=frozenset(paths))


def _natural(name: str) -> list[int | str]:
    # gpu-2 before gpu-10
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def summarize(view: ContainerView) -> str:
    """One line per device the container got: ``gpu-3 NVIDIA H200 /dev/nvidia3 [TimeSlicing]``."""
    lines = []
    gpu_nodes = sorted(view.gpu_nodes, key=lambda p: int(p.removeprefix("/dev/nvidia")))
    for name in sorted(view.device_names, key=_natural):
        prefix = env_prefix(name)
        parts = [view.env[prefix], view.env.get(f"{prefix}_PRODUCT", "")]
        if profile := view.env.get(f"{prefix}_MIG_PROFILE"):
            parts.append(f"MIG {profile}")
        strategy = view.env.get(f"{prefix}_SHARING_STRATEGY")
        interval = view.env.get(f"{prefix}_TIMESLICE_INTERVAL")
        # Time-slicing at the default interval is what every GPU does unconfigured: not news.
        if strategy and (strategy, interval or "Default") != ("TimeSlicing", "Default"):
            parts.append(f"[{strategy}{f' {interval}' if interval else ''}]")
        lines.append(" ".join(p for p in parts if p))
    if not lines:
        return "no GPU"
    if gpu_nodes:
        lines[-1] += f" ({', '.join(gpu_nodes)})"
    return "\n".join(lines)


SHARE_ID_CHARS = 8  # enough to tell the shares of one GPU apart; the claim's status has it all


def device_lines(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """The DEVICE cell's lines for a claim's allocation results: the device, and for a share of
    a device (consumable capacity: the result has a ``shareID``) its shareID's start and what it
    consumed, ``gpu-0 share 3f9a01bc`` then ``  consumed memory 40Gi``."""
    lines = []
    for r in results:
        share = str(r.get("shareID") or "")
        if not share:
            lines.append(str(r["device"]))
            continue
        consumed = r.get("consumedCapacity") or {}
        lines.append(f"{r['device']} share {share[:SHARE_ID_CHARS]}")
        lines += [f"  consumed {name} {amount}" for name, amount in sorted(consumed.items())]
    return lines


@dataclass(frozen=True)
class Row:
    pod: str  # namespace/name[/container]
    claim: str
    node: str
    devices: str
    saw: str
    source: str  # "log", "cdi", "admission" (refused, never ran) or "" when nothing was observed


# The demo's GPUs are simulated on every node (a "real" node is a real kubelet + containerd):
# the heading, the columns and the last line say so, so that no one reads the table as hardware.
HEADERS = ("POD", "CLAIM", "NODE", "DEVICE (SIMULATED)", "WHAT THE CONTAINER SAW (SIMULATED GPUS)")
SOURCE_MARK = {"log": "(log)", "cdi": "(CDI)", "admission": "(admission)", "": ""}
_DENIED = re.compile(r'admission webhook "([^"]+)" denied the request: ')


def admission_refusal(body: str | None) -> str | None:
    """The webhook's reason when an API error ``body`` is an admission webhook's refusal."""
    try:
        message = str(json.loads(body or "").get("message", ""))
    except (ValueError, AttributeError):
        return None
    match = _DENIED.search(message)
    return message[match.end() :] if match else None


def refused_rows(
    scenario: str, refused: Mapping[str, Any], pods: Iterable[str], why: str
) -> list[Row]:
    """One row per pod of a scenario whose ``refused`` object the admission webhook turned down:
    the pods were never created, so nothing ran. One line per problem, wrapped between words
    (a field path stays whole)."""
    lines = [
        line
        for part in why.split("; ")
        for line in textwrap.wrap(part, width=72, break_long_words=False, break_on_hyphens=False)
    ]
    saw = "\n".join(["refused at admission:", *lines])
    name = f"{refused['kind']} {refused['metadata']['name']}"
    return [Row(f"{scenario}/{pod}", name, "-", "-", saw, "admission") for pod in pods]


@dataclass(frozen=True)
class Simulated:
    """A demo node without a kubelet: ``reason`` says why, ``log`` where to read more (when a
    real node failed); ``on_purpose``: asked for (real nodes turned off), nothing failed."""

    node: str
    reason: str
    log: str = ""
    on_purpose: bool = False


def fallback_notice(simulated: Sequence[Simulated], *, some_real: bool) -> list[str]:
    """The warning when a real node was wanted and did not start: why, and the log that says
    more; ``some_real``: the other nodes are real (the pods run there only). Nothing when every
    node is real or simulated on purpose."""
    failed = [s for s in simulated if not s.on_purpose]
    if not failed:
        return []
    reasons = "; ".join(dict.fromkeys(s.reason or f"node {s.node} did not start" for s in failed))
    head = "SOME NODES ARE SIMULATED" if some_real else "NO CONTAINER RAN"
    return [
        f"{head}: {reasons}.",
        *(f"  See why: less {log}" for log in dict.fromkeys(s.log for s in failed if s.log)),
    ]


def on_purpose_line(simulated: Sequence[Simulated]) -> list[str]:
    """One line naming the nodes simulated on purpose and why; none when there are none."""
    chosen = [s for s in simulated if s.on_purpose]
    if not chosen:
        return []
    reasons = "; ".join(dict.fromkeys(s.reason for s in chosen if s.reason))
    names = ", ".join(s.node for s in chosen)
    return [f"Simulated on purpose (no kubelet): {names}" + (f", {reasons}." if reasons else ".")]


def simulated_gpus_line(profiles: Sequence[str]) -> str:
    """The line that says the GPUs are simulated, above the table and as the demo's last line:
    the rows read "NVIDIA H200" on nodes called real, and none of it is hardware."""
    named = ", ".join(dict.fromkeys(profiles))
    return (
        f"GPUs: SIMULATED on every node (profiles {named}), no NVIDIA hardware: names, UUIDs and "
        "/dev/nvidia* come from the profile; a real node is a real kubelet + containerd, not a "
        "real GPU (make demo-gpu runs on one)."
    )


def heading(simulated: Sequence[Simulated], *, some_real: bool, profiles: Sequence[str]) -> str:
    """The line(s) above the table: a failure's warning, then where "what the container saw"
    comes from, then that the GPUs are simulated."""
    notice = fallback_notice(simulated, some_real=some_real)
    if some_real:
        source = [
            "Pods on real nodes (kubelet + containerd); each container's report read from its log:"
        ]
    else:
        source = [
            "Pods on simulated nodes (no kubelet): what each container would see, from the CDI",
            "edits of the devices NodePrepareResources returned:",
        ]
    return "\n".join([*notice, *source, simulated_gpus_line(profiles)])


def render_table(rows: Sequence[Row]) -> str:
    """A plain-text table; multi-line cells continue on the following lines."""
    cells = [
        [r.pod, r.claim, r.node, r.devices, f"{r.saw} {SOURCE_MARK[r.source]}".strip()]
        for r in rows
    ]
    split = [[c.splitlines() or [""] for c in row] for row in cells]
    widths = [len(h) for h in HEADERS]
    for row in split:
        for i, lines in enumerate(row):
            widths[i] = max(widths[i], *(len(line) for line in lines))
    out = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    for row in split:
        height = max(len(lines) for lines in row)
        for k in range(height):
            line = [
                (lines[k] if k < len(lines) else "").ljust(w)
                for lines, w in zip(row, widths, strict=True)
            ]
            out.append("  ".join(line).rstrip())
    return "\n".join(out)
