"""No import cycles: no module imports, directly or through others, a module that imports it back.

In a cycle one of the modules runs while the other is half-initialized, and a module run with
``python -m`` that its own imports import again loads twice (two copies of every class). Imports
inside functions count too: they are cycles that wait for a code path.
"""

from __future__ import annotations

import grimp

PACKAGES = ("dra_gpu", "e2e")


def import_cycles() -> list[str]:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles: dict[frozenset[str], str] = {}
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.setdefault(frozenset(back), " -> ".join((module, *back)))
    return sorted(cycles.values())


def test_the_tree_has_no_import_cycles() -> None:
    assert import_cycles() == []
