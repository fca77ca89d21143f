"""Every command the docs name exists, with the flags they give it: a renamed target, module or
flag that leaves a doc behind fails here.

Over README.md and docs/**/*.md, in code (backtick spans and fenced blocks), each command a line
starts (also after ``&&``, ``;``, ``|`` or ``kubectl exec ... --``):

- ``make TARGET``: a target of the Makefile;
- ``python -m MODULE`` of this project (``dra_gpu``, ``e2e``, ``bench``): the module exists, and
  its flags are options of its argparse parser (and of the subcommand it names);
- ``bench/NAME.py``: the script exists, and its flags are options of its parser;
- ``dra-gpu VERB``: a subcommand of ``dra_gpu.cli.build_parser()``, with its flags.

Nothing is run: a parser is built by calling the entry point with ``ArgumentParser.parse_args``
replaced by one that hands the parser back before anything else happens; an entry point that
calls no parser is not called, and then no flag may be given to it.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from dra_gpu import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OURS = ("dra_gpu", "e2e", "bench")

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
SHELL_FENCES = ("", "sh", "bash", "shell", "console")  # not text, yaml, json: output and data
_SPAN = re.compile(r"`([^`\n]+)`")
_SPLIT = re.compile(r"&&|\|\||;|\||\$\(|\s--\s")
_SPLIT_SPAN = re.compile(r"&&|\|\||\||\$\(|\s--\s")  # a span's ";" is prose, not a shell's
_LEAD = re.compile(r"^(?:\$\s+|sudo\s+|time\s+|[A-Z_][A-Z0-9_]*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)+")
_MAKE = re.compile(r"^make\s+(.*)$")
_PYTHON_M = re.compile(r"^(?:\S*/)?python[\d.]*\s+-m\s+(\w+(?:\.\w+)*)(?![.*\w])(.*)$")
_BENCH = re.compile(r"^(?:(?:\S*/)?python[\d.]*\s+)?(bench/\w+\.py)(.*)$")
_DRA_GPU = re.compile(r"^(?:\S*/)?dra-gpu\s+([a-z][\w-]*)(.*)$")
_FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)")
_TARGET = re.compile(r"^([A-Za-z][\w-]*)\s*:(?!=)", re.M)


@dataclass(frozen=True)
class Command:
    doc: str
    kind: str  # "make", "module", "bench", "dra-gpu"
    name: str  # target, module, script path or verb
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}: {self.kind} {self.name} {' '.join(self.args)}".rstrip()


def code_lines(text: str) -> Iterator[tuple[str, re.Pattern[str]]]:
    """The lines of the shell (or unnamed) fenced blocks, then the backtick spans outside any
    block; a line ending in a backslash is joined with the next."""
    for lang, block in _FENCE.findall(text):
        if lang.strip() in SHELL_FENCES:
            yield from ((line, _SPLIT) for line in block.replace("\\\n", " ").splitlines())
    yield from ((span, _SPLIT_SPAN) for span in _SPAN.findall(_FENCE.sub("", text)))


def _words(rest: str) -> tuple[str, ...]:
    rest = rest.split(" #", 1)[0]
    return tuple(w.strip("[]()'\"") for w in rest.split() if w.strip("[]()'\""))


def commands_in(doc: str, text: str) -> Iterator[Command]:
    for line, split in code_lines(text):
        for segment in split.split(line):
            segment = _LEAD.sub("", segment.strip())
            if m := _MAKE.match(segment):
                for word in _words(m.group(1)):
                    if word.startswith("-") or "=" in word:
                        continue
                    yield Command(doc, "make", word, ())
            elif m := _PYTHON_M.match(segment):
                if m.group(1).split(".")[0] in OURS:
                    yield Command(doc, "module", m.group(1), _words(m.group(2)))
            elif m := _BENCH.match(segment):
                yield Command(doc, "bench", m.group(1), _words(m.group(2)))
            elif m := _DRA_GPU.match(segment):
                yield Command(doc, "dra-gpu", m.group(1), _words(m.group(2)))


def all_commands() -> list[Command]:
    found = {c for doc in DOCS for c in commands_in(doc.name, doc.read_text())}
    return sorted(found, key=str)


# ----- what exists ---------------------------------------------------------------------------


def make_targets() -> set[str]:
    return set(_TARGET.findall((ROOT / "Makefile").read_text()))


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _entry_point(module: str) -> Callable[..., Any] | None:
    """``main`` of a module; for a package, of what its ``__main__`` calls ``X.main()`` on."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"no module {module}"
    if spec.submodule_search_locations is None:
        main = getattr(importlib.import_module(module), "main", None)
        return main if callable(main) else None
    source_path = Path(next(iter(spec.submodule_search_locations))) / "__main__.py"
    assert source_path.is_file(), f"{module} is a package without __main__.py"
    tree = ast.parse(source_path.read_text())
    imported = {
        (alias.asname or alias.name): f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            main = getattr(importlib.import_module(f"{module}.__main__"), "main", None)
            return main if callable(main) else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "main"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in imported
        ):
            target = importlib.import_module(imported[node.func.value.id])
            main = getattr(target, "main", None)
            return main if callable(main) else None
    return None


def parser_of(main: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``main`` builds, taken at its first parse: nothing after that runs."""

    def capture(self: argparse.ArgumentParser, *_: Any, **__: Any) -> NoReturn:
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    try:
        main([]) if inspect.signature(main).parameters else main()
    except _Captured as captured:
        return captured.parser
    raise AssertionError(f"{main.__module__}.main returned without parsing its arguments")


def parses(main: Callable[..., Any]) -> bool:
    """Whether ``main`` parses arguments at all (read in its source, not called)."""
    return bool(re.search(r"parse_(known_)?args\(", inspect.getsource(main)))


def options(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> set[str]:
    """The option strings of ``parser``, and of each subcommand that ``words`` names."""
    found = {o for action in parser._actions for o in action.option_strings}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for i, word in enumerate(words):
        for sub in subs:
            if word in sub.choices:
                return found | options(sub.choices[word], words[i + 1 :])
    return found


def flags(words: tuple[str, ...]) -> list[str]:
    return [m.group(1) for w in words if (m := _FLAG.match(w))]


def unknown_flags(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> list[str]:
    known = options(parser, words)
    return [f for f in flags(words) if f not in known]


# ----- the checks ----------------------------------------------------------------------------


COMMANDS = all_commands()


def test_the_docs_name_commands_of_every_kind() -> None:
    kinds = {c.kind for c in COMMANDS}
    assert kinds == {"make", "module", "bench", "dra-gpu"}, kinds  # the extraction still works
    assert len(COMMANDS) > 50


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind == "make"], ids=str)
def test_make_target_exists(command: Command) -> None:
    assert command.name in make_targets(), f"{command}: no such target in the Makefile"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind == "dra-gpu"], ids=str)
def test_dra_gpu_verb_and_flags_exist(command: Command) -> None:
    parser = cli.build_parser()
    (verbs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert command.name in verbs.choices, f"{command}: dra-gpu has no subcommand {command.name}"
    words = (command.name, *command.args)
    assert unknown_flags(parser, words) == [], f"{command}: flags dra-gpu does not take"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind in ("module", "bench")], ids=str)
def test_module_and_script_exist_with_their_flags(
    command: Command, monkeypatch: pytest.MonkeyPatch
) -> None:
    if command.kind == "bench":
        assert (ROOT / command.name).is_file(), f"{command}: no such script"
        module = command.name.removesuffix(".py").replace("/", ".")
    else:
        module = command.name
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{command}: no module {module}")
    main = _entry_point(module)
    if main is None or not parses(main):
        assert flags(command.args) == [], f"{command}: flags given to a command that takes none"
        return
    parser = parser_of(main, monkeypatch)
    assert unknown_flags(parser, command.args) == [], f"{command}: flags it does not take"


# ----- the extraction itself -----------------------------------------------------------------


def test_commands_are_found_where_a_shell_would_start_them() -> None:
    text = """
Run `make matrix` or `K8S_VERSIONS="v1.34.4" make matrix MATRIX_ARGS=--reuse`.

```sh
.venv/bin/python bench/scale.py --nodes 1000 \\
    --layouts static   # a comment --not-a-flag
kubectl -n dra-gpu get pods && kubectl exec p -- dra-gpu discover -o yaml
helm install dra-gpu manifests/helm/dra-gpu
python -m pytest -q
```
"""
    found = {str(c) for c in commands_in("x.md", text)}
    assert found == {
        "x.md: make matrix",
        "x.md: bench bench/scale.py --nodes 1000 --layouts static",
        "x.md: dra-gpu discover -o yaml",
    }


def test_an_unknown_flag_or_subcommand_flag_is_caught() -> None:
    parser = cli.build_parser()
    assert unknown_flags(parser, ("discover", "--simulate", "h200x8", "-o", "json")) == []
    assert unknown_flags(parser, ("discover", "--no-such-flag")) == ["--no-such-flag"]
    # A subcommand's flag is not another's.
    assert unknown_flags(parser, ("top", "--simulate", "x")) == ["--simulate"]


def test_a_script_parser_is_taken_without_running_it(monkeypatch: pytest.MonkeyPatch) -> None:
    main = _entry_point("bench.scale")
    assert main is not None and parses(main)
    parser = parser_of(main, monkeypatch)  # would start a cluster if it ran on
    assert unknown_flags(parser, ("--nodes", "1000", "--allow-partial")) == []
    assert unknown_flags(parser, ("--nodes", "1000", "--partial")) == ["--partial"]
    package = _entry_point("e2e.demo")  # a package: what its __main__ calls
    assert package is not None and package.__module__ == "e2e.demo.run"
