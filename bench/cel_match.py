"""What each slice layout costs the scheduler per device: Kubernetes' selector evaluation, timed.

Usage: ``.venv/bin/python bench/cel_match.py [--blocks 60] [--devices-per-block 2000]``

At fleet scale the scheduler's DRA filter evaluates, for every pod and every node it tries,
the device class's CEL selectors and the claim's on the node's devices (``bench/scale.py``'s
scheduler profile: ``DeviceMatches`` is the largest single item). Before each evaluation
Kubernetes turns all of the device's attributes and capacities into CEL values (a version
attribute is parsed as semver each time), so what a device costs grows with what it publishes,
whatever the expression reads. This benchmark isolates that cost from the rest of a cluster:

- the devices are the ones ``bench/scale.py`` publishes per layout (``bench/scale_layouts.py``:
  the product's discovery and slice builder), one node's worth;
- the expressions are the product's DeviceClass selectors (``controller.classes``) followed by
  the layout's claim selector, evaluated in that order as the allocator does;
- the evaluator is ``k8s.io/dynamic-resource-allocation/cel`` at the version pinned in
  ``bench/gomod/celmatch/go.mod`` (the harness's Kubernetes version), in a small Go program
  built from that module into the binaries cache;
- ``no-versions`` (``static`` without its three version attributes) shows what they cost; the
  driver cannot drop them: claims written for NVIDIA's driver compare them with ``semver``.

The layouts take turns, block by block, so a busy machine slows all of them alike. Prints one
table: per layout, attributes and capacities per device, microseconds per device (all
expressions once; the median over the blocks, and the fastest block) and the ratio of the
medians to ``minimal``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scale_layouts as sl  # noqa: E402
from dra_gpu import DRIVER_NAME  # noqa: E402
from dra_gpu.controller import classes  # noqa: E402
from e2e import binaries, dra_patch  # noqa: E402

JSON = dict[str, Any]
GOMOD = ROOT / "bench" / "gomod" / "celmatch"
DRA_MODULE = "k8s.io/dynamic-resource-allocation"
BINARY = "celmatch"


def source_key() -> str:
    """The first 12 hex digits of the SHA-256 of the Go program's module files."""
    source = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        source.update((GOMOD / name).read_bytes())
    return source.hexdigest()[:12]


def patched_gomod(version: str) -> tuple[Path, str]:
    """A copy of the Go program's module whose go.mod replaces the evaluator's module with the
    patched copy (``e2e.dra_patch``), and the patch's key."""
    module, key = dra_patch.patched_module(version)
    target = binaries.cache_root() / "gomod" / f"celmatch-{version}-{source_key()}-patched-{key}"
    if not (target / "main.go").is_file():
        target.mkdir(parents=True, exist_ok=True)
        (target / "go.sum").write_bytes((GOMOD / "go.sum").read_bytes())
        (target / "go.mod").write_text(
            dra_patch.with_replace((GOMOD / "go.mod").read_text(), module)
        )
        (target / "main.go").write_bytes((GOMOD / "main.go").read_bytes())
    return target, key


def celmatch_binary(version: str, *, patched: bool = False) -> Path:
    """The Go program, built once per pinned ``version`` and source into the binaries cache;
    with ``patched``, against Kubernetes' evaluator with ``docs/upstream/``'s patch."""
    name = f"celmatch-{version}-{source_key()}"
    src = GOMOD
    if patched:
        src, key = patched_gomod(version)
        name += f"-patched-{key}"
    out = binaries.cache_root() / name
    binaries.build_missing(
        out,
        [BINARY],
        src=lambda: src,
        argv=lambda tmp, _: ["go", "build", "-ldflags", "-s -w", "-o", str(tmp / BINARY), "."],
        env={**os.environ, "CGO_ENABLED": "0"},
        label=version,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    return out / BINARY


def class_expressions(name: str) -> list[str]:
    """The CEL of the product's built-in DeviceClass ``name``, in order."""
    for desired in classes.builtin_classes(extended_resource_name=None):
        if desired.name == name:
            return [s["cel"]["expression"] for s in desired.spec.get("selectors") or []]
    raise KeyError(name)


def node_devices(layout: sl.Layout) -> list[JSON]:
    """Every device one node of the layout publishes, as the slices carry them."""
    rendered = layout.render("kwok-node-00000", "00000000-0000-0000-0000-000000000000")
    return [d for body in rendered for d in body["spec"].get("devices") or []]


@dataclass(frozen=True)
class Case:
    name: str
    expressions: list[str]
    devices: list[JSON]

    @property
    def fields_per_device(self) -> float:
        """Attributes plus capacities, the mean over the devices."""
        total = sum(
            len(d.get("attributes") or {}) + len(d.get("capacity") or {}) for d in self.devices
        )
        return total / len(self.devices)

    def body(self) -> JSON:
        return {
            "name": self.name,
            "driver": DRIVER_NAME,
            "expressions": self.expressions,
            "devices": self.devices,
        }


def cases(layouts: Mapping[str, sl.Layout]) -> list[Case]:
    return [
        Case(
            layout.name,
            [*class_expressions(layout.device_class), layout.selector],
            node_devices(layout),
        )
        for layout in layouts.values()
    ]


def table(measured: Sequence[tuple[Case, JSON]]) -> list[str]:
    base = next(r["ns_per_device"] for c, r in measured if c.name == "minimal")
    lines = [
        "| layout | attributes + capacities per device | devices matching | "
        "us per device, median (fastest) | x minimal |",
        "|---|---|---|---|---|",
    ]
    for case, result in measured:
        ns, fastest = float(result["ns_per_device"]), float(result["ns_per_device_min"])
        lines.append(
            f"| {case.name} | {case.fields_per_device:.1f} | {result['matched']} / "
            f"{len(case.devices)} | {ns / 1000:.2f} ({fastest / 1000:.2f}) | {ns / base:.2f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60, help="turns each layout takes")
    parser.add_argument("--devices-per-block", type=int, default=2000)
    parser.add_argument(
        "--patched",
        action="store_true",
        help="evaluate with docs/upstream/dra-cel-lazy-attributes.patch applied to the module",
    )
    args = parser.parse_args(argv)
    version = binaries.module_version(GOMOD / "go.mod", DRA_MODULE)
    binary = celmatch_binary(version, patched=args.patched)
    todo = cases(sl.LAYOUTS)
    proc = subprocess.run(
        [str(binary)],
        input=json.dumps(
            {
                "blocks": args.blocks,
                "devices_per_block": args.devices_per_block,
                "cases": [c.body() for c in todo],
            }
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    print(
        f"{DRA_MODULE} {version}{' (patched)' if args.patched else ''}, {os.cpu_count()} CPUs, "
        f"{args.blocks} blocks of "
        f"{args.devices_per_block} devices per layout\n"
    )
    print("\n".join(table(list(zip(todo, results, strict=True)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
