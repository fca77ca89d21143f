"""Every file and module the docs name exists: a rename or a removal that leaves a doc behind
fails here.

Cases, over README.md and every .md under docs/, for each name in backticks:
- a path ending in a source or config suffix (``prepare/cdi.py``, ``manifests/helm/...yaml``)
  exists relative to the repository, to ``dra_gpu/`` or to ``docs/``, or (a bare file name) as a
  file somewhere in the tree;
- a dotted ``dra_gpu.`` or ``e2e.`` name is a module, or an attribute of one.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SUFFIXES = (".py", ".proto", ".toml", ".sh", ".c", ".cu", ".md")
PATH = re.compile(r"^[\w.\-/]+(" + "|".join(re.escape(s) for s in SUFFIXES) + r")$")
DOTTED = re.compile(r"^(dra_gpu|e2e)(\.\w+)+$")
BASES = (ROOT, ROOT / "dra_gpu", ROOT / "docs", ROOT / "dra_gpu" / "kubeletplugin")
SKIP_DIRS = {".git", ".venv", "node_modules", ".mypy_cache"}


def spans(text: str) -> Iterator[str]:
    for span in re.findall(r"`([^`\n]+)`", text):
        yield span.strip().split("::")[0].rstrip(":")


def named(kind: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted({(doc.name, s) for doc in DOCS for s in spans(doc.read_text()) if kind.match(s)})


def tree_files() -> set[str]:
    return {
        p.name
        for p in ROOT.rglob("*")
        if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
    }


def file_exists(name: str, files: set[str]) -> bool:
    if name.startswith("/"):
        return True  # a path on the node (/etc/containerd/config.toml), not in this tree
    if "/" not in name:
        return name in files
    return any((base / name).exists() for base in BASES)


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_file_a_doc_names_exists() -> None:
    files = tree_files()
    missing = [f"{doc}: {name}" for doc, name in named(PATH) if not file_exists(name, files)]
    assert missing == []


@pytest.mark.parametrize(("doc", "dotted"), named(DOTTED), ids=lambda v: str(v))
def test_every_module_a_doc_names_exists(doc: str, dotted: str) -> None:
    assert resolves(dotted), f"{doc} names {dotted}, which does not exist"
