"""docs/user/configuration.md against the code: a missing or stale line fails here.

Cases:
- every subcommand of ``dra_gpu.cli.build_parser()`` has a section, and its flag table lists
  exactly the subcommand's flags (none missing, none that no longer exist);
- the kubelet plugin's table names the environment variable each flag reads, and so does the
  short table of docs/concepts/kubelet-plugin.md, which lists every flag too;
- the attribute and capacity tables list exactly the names ``dra_gpu.devices.model`` publishes,
  with the right value type and the right device types (full GPU / MIG);
- every field of the opaque config kinds is documented under its kind;
- every value of the Helm chart's values.yaml is in the values table, and nothing else is.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from dra_gpu import cli
from dra_gpu.config import GpuConfig, MigDeviceConfig
from dra_gpu.devices import model
from dra_gpu.plugin import settings as plugin_settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "user" / "configuration.md"
VALUES = ROOT / "manifests" / "helm" / "dra-gpu" / "values.yaml"
CHECK = "✓"


def sections(text: str) -> dict[str, str]:
    """Heading text (without #) -> the body up to the next heading of any level."""
    found: dict[str, str] = {}
    heading = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            if heading is not None:
                found[heading] = "\n".join(body)
            heading, body = line.lstrip("#").strip(), []
        else:
            body.append(line)
    if heading is not None:
        found[heading] = "\n".join(body)
    return found


def table_rows(body: str) -> list[list[str]]:
    """Cells of the first Markdown table in ``body``, header and separator left out."""
    rows: list[list[str]] = []
    started = False
    for line in body.splitlines():
        if line.startswith("|"):
            started = True
            # `\|` is a literal bar inside a cell.
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            rows.append([c.strip().replace("\\|", "|") for c in cells])
        elif started:
            break
    assert len(rows) >= 2, "no table found"
    return rows[2:]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@pytest.fixture(scope="module")
def doc() -> dict[str, str]:
    return sections(DOC.read_text())


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def code_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag not in ("-h", "--help")
    }


def doc_flags(rows: list[list[str]]) -> set[str]:
    # A cell may hold `--flag METAVAR` or several flags: `-o`, `--output`.
    return {span.split()[0] for row in rows for span in code_spans(row[0])}


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_flag_of_every_subcommand_is_documented(doc: dict[str, str], name: str) -> None:
    heading = f"`dra-gpu {name}`"
    assert heading in doc, f"docs/user/configuration.md has no section {heading}"
    flags = code_flags(subcommands()[name])
    if not flags:
        return
    documented = doc_flags(table_rows(doc[heading]))
    assert not flags - documented, f"dra-gpu {name}: flags missing from the docs"
    assert not documented - flags, f"dra-gpu {name}: documented flags that do not exist"


def test_plugin_flags_name_their_environment_variables(doc: dict[str, str]) -> None:
    parser = subcommands()["kubelet-plugin"]
    dest_of = {f: a.dest for a in parser._actions for f in a.option_strings}
    for row in table_rows(doc["`dra-gpu kubelet-plugin`"]):
        flag = code_spans(row[0])[0].split()[0]
        expected = plugin_settings.ENV_VARS[dest_of[flag]]
        assert code_spans(row[1]) == [expected], f"{flag} reads {expected}"


def test_kubelet_plugin_page_lists_every_flag_with_its_variable() -> None:
    # docs/concepts/kubelet-plugin.md has its own short table (default only), which went stale once.
    page = (ROOT / "docs" / "concepts" / "kubelet-plugin.md").read_text()
    parser = subcommands()["kubelet-plugin"]
    dest_of = {f: a.dest for a in parser._actions for f in a.option_strings}
    rows = table_rows(page)
    assert doc_flags(rows) == code_flags(parser)
    for row in rows:
        flag = code_spans(row[0])[0].split()[0]
        assert code_spans(row[1]) == [plugin_settings.ENV_VARS[dest_of[flag]]], flag


def _marks(row: list[str], column: int) -> bool:
    return row[column] == CHECK


KIND_NAMES = {str: "string", model.Version: "version", int: "int", bool: "bool"}


def test_attribute_table_matches_what_is_published(doc: dict[str, str]) -> None:
    rows = {code_spans(r[0])[0]: r for r in table_rows(doc["Published attributes"])}
    assert set(rows) == set(model.ATTRIBUTE_NAMES)
    for name, row in rows.items():
        assert row[1] == KIND_NAMES[model.ATTRIBUTE_KINDS[name]], f"type of {name}"
        assert _marks(row, 2) == (name in model.GPU_ATTRIBUTE_NAMES), f"{name} on full GPUs"
        assert _marks(row, 3) == (name in model.MIG_ATTRIBUTE_NAMES), f"{name} on MIG devices"


def test_capacity_table_matches_what_is_published(doc: dict[str, str]) -> None:
    rows = {code_spans(r[0])[0]: r for r in table_rows(doc["Published capacities"])}
    assert set(rows) == set(model.CAPACITY_NAMES)
    for name, row in rows.items():
        assert _marks(row, 1) == (name in model.GPU_CAPACITY_NAMES), f"{name} on full GPUs"
        assert _marks(row, 2) == (name in model.MIG_CAPACITY_NAMES), f"{name} on MIG devices"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    candidates = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    for candidate in (annotation, *candidates):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def field_paths(cls: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in cls.model_fields.items():
        if not prefix and name in ("apiVersion", "kind"):
            continue
        path = f"{prefix}{name}"
        nested = _model_of(info.annotation)
        if nested is None:
            yield path
        else:
            yield from field_paths(nested, f"{path}.")


def test_every_config_field_is_documented(doc: dict[str, str]) -> None:
    documented: dict[str, set[str]] = {}
    kind = ""
    for row in table_rows(doc["Opaque configuration (`resource.nvidia.com/v1beta1`)"]):
        kind = (code_spans(row[0]) or [kind])[0]
        documented.setdefault(kind, set()).update(code_spans(row[2]))
    for cls in (GpuConfig, MigDeviceConfig):
        name = cls.__name__
        assert name in documented, f"config kind {name} is not documented"
        for path in field_paths(cls):
            parts = path.split(".")
            prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
            assert prefixes & documented[name], f"{name}.{path} is not documented"


def value_keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Leaf keys of values.yaml; an empty mapping is a leaf (a value users fill in)."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from value_keys(value, f"{path}.")
        else:
            yield path


def test_every_chart_value_is_documented(doc: dict[str, str]) -> None:
    keys = set(value_keys(yaml.safe_load(VALUES.read_text())))
    documented = {code_spans(r[0])[0] for r in table_rows(doc["Helm chart values"])}
    assert not keys - documented, "chart values missing from docs/user/configuration.md"
    assert not documented - keys, "documented chart values that values.yaml does not have"


def test_table_parser_sees_escaped_bars_as_text() -> None:
    rows = table_rows("| a | b |\n|---|---|\n| `x\\|y` | z |\n\nafter")
    assert rows == [["`x|y`", "z"]]
