"""Every package of the driver sits in the declared layers, and no two packages import each other.

``lint-imports`` checks only the modules a contract names: a package left out of the layers
contract can import anything, and a cycle through it goes unseen (``sharing`` and ``mig`` once hid
two: ``devices.naming -> mig.partitions`` and ``sharing -> prepare`` while ``prepare`` imported
``sharing``). Cases:

- every top-level package and module of ``dra_gpu`` is named in the layers contract, or is one of
  the entry points that only start the CLI;
- the graph of top-level packages (module imports squashed to their package) has no cycle.
"""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

import grimp

import dra_gpu

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = {"dra_gpu.__main__"}  # `python -m dra_gpu`: calls dra_gpu.cli, nothing else


def layered_modules() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = [
        c for c in contracts if c["type"] == "layers" and c["layers"][0].startswith("dra_gpu")
    ]
    assert len(layers) == 1, "one layers contract for the driver"
    return {name.strip() for layer in layers[0]["layers"] for name in re.split(r"[|:]", layer)}


def top_level() -> set[str]:
    return {f"dra_gpu.{m.name}" for m in pkgutil.iter_modules(dra_gpu.__path__)}


def test_every_package_is_in_a_layer() -> None:
    assert top_level() - ENTRY_POINTS - layered_modules() == set()


def package_cycles() -> list[str]:
    """Each chain of imports that leaves a package and comes back to it, shortest first."""
    graph = grimp.build_graph("dra_gpu", cache_dir=None, exclude_type_checking_imports=True)
    packages = sorted(top_level())
    cycles: dict[frozenset[str], str] = {}
    for package in packages:
        for other in packages:
            if other == package:
                continue
            there = graph.find_shortest_chains(importer=package, imported=other)
            back = graph.find_shortest_chains(importer=other, imported=package)
            if there and back:
                out, home = min(there, key=len), min(back, key=len)
                cycles.setdefault(frozenset((package, other)), " -> ".join((*out, *home[1:])))
    return sorted(cycles.values())


def test_no_two_packages_import_each_other() -> None:
    assert package_cycles() == []
