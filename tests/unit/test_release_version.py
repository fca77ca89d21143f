"""The release's version is one number everywhere it is written, and CHANGELOG.md describes it.

Cases:
- ``pyproject.toml``'s version, ``dra_gpu.__version__`` (``dra-gpu version``) and the chart's
  ``version`` and ``appVersion`` are the same;
- the image tag the chart defaults to is that version: ``values.yaml`` leaves ``image.tag`` empty
  and the image template falls back to ``appVersion`` (or the value is the version itself), and
  the committed plain manifests, the chart rendered with its defaults, run ``dra-gpu:<version>``
  and carry it in their version labels;
- CHANGELOG.md's newest section is that version's, dated (``## 0.2.0 — 2026-12-06``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

import dra_gpu

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "dra-gpu"
RENDERED = sorted((ROOT / "manifests" / "rendered").glob("*.yaml"))
SECTION = re.compile(r"^## (\S+) — (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def test_package_and_chart_versions_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+", version())
    assert dra_gpu.__version__ == version()
    assert (str(chart["version"]), str(chart["appVersion"])) == (version(), version())


def test_the_default_image_tag_is_the_version() -> None:
    tag = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"]
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    if not tag:
        assert ".Values.image.tag | default .Chart.AppVersion" in helpers
    else:
        assert tag == version()


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def test_the_rendered_manifests_run_and_label_the_version() -> None:
    assert RENDERED
    for path in RENDERED:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        images = {c["image"] for d in docs for c in _containers(d)}
        assert images == {f"dra-gpu:{version()}"}, path.name
        for doc in docs:
            labels = doc["metadata"].get("labels") or {}
            if "helm.sh/chart" in labels:
                assert labels["helm.sh/chart"] == f"dra-gpu-{version()}", path.name
                assert labels["app.kubernetes.io/version"] == version(), path.name


def test_the_changelogs_newest_section_is_this_version() -> None:
    sections = SECTION.findall((ROOT / "CHANGELOG.md").read_text())
    assert sections, "CHANGELOG.md has no '## <version> — <YYYY-MM-DD>' section"
    assert sections[0][0] == version()
    assert len({v for v, _ in sections}) == len(sections)  # one section per version
