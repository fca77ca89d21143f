"""The container image's recipe, checked without a container engine.

Cases:
- the Dockerfile is multi-stage, every base image is pinned by tag, and the runtime stage copies
  only the build stage's virtualenv;
- the runtime stage runs no shell: ENTRYPOINT, CMD and RUN use the exec (JSON) form, and the
  entrypoint is the ``dra-gpu`` console script;
- the runtime stage ends as a numeric, non-root USER (what ``runAsNonRoot`` can verify);
- everything the Dockerfile copies is let through by ``.dockerignore``;
- ``requirements.lock`` pins every runtime dependency of pyproject.toml to a version its
  specifier allows, and nothing of the dev tool chain.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from e2e import lock

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "Dockerfile ends inside a line continuation"
    return lines


def _expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = _expand(default.strip(), args)
        elif keyword == "FROM":
            match = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert match, f"cannot parse FROM {rest!r}"
            base = _expand(match.group(1), args)
            stages.append(Stage(base=base, name=match.group(2)))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())[1]


def _exec_form(value: str) -> list[str] | None:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return None
    if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
        return parsed
    return None


def test_multi_stage_with_pinned_bases(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    for stage in stages:
        image, _, tag = stage.base.rpartition(":")
        assert image and tag and tag != "latest", f"base image not pinned by tag: {stage.base}"
        assert stage.base.startswith("python:3.12-slim")


def test_runtime_stage_copies_only_the_build_virtualenv(stages: list[Stage]) -> None:
    runtime = stages[-1]
    build_names = {stage.name for stage in stages[:-1]}
    copies = [rest for keyword, rest in runtime.instructions if keyword in ("COPY", "ADD")]
    assert copies, "the runtime stage copies nothing"
    for rest in copies:
        match = re.match(r"--from=(\S+)\s", rest)
        assert match and match.group(1) in build_names, f"runtime copies from outside: {rest}"


def test_runtime_stage_runs_no_shell(stages: list[Stage]) -> None:
    runtime = stages[-1]
    entrypoints = [rest for keyword, rest in runtime.instructions if keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    entrypoint = _exec_form(entrypoints[0])
    assert entrypoint is not None, "ENTRYPOINT is in shell form"
    assert Path(entrypoint[0]).name == "dra-gpu"
    for keyword, rest in runtime.instructions:
        if keyword in ("RUN", "CMD", "ENTRYPOINT"):
            assert _exec_form(rest) is not None, f"{keyword} {rest} is in shell form"


def test_runtime_user_is_numeric_and_not_root(stages: list[Stage]) -> None:
    users = [rest for keyword, rest in stages[-1].instructions if keyword == "USER"]
    assert users, "no USER in the runtime stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    keywords = [keyword for keyword, _ in stages[-1].instructions]
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.rstrip("/")
        if fnmatch.fnmatch(path, body) or path.startswith(body + "/"):
            ignored = not negate
    return ignored


def test_dockerignore_lets_through_what_is_copied(stages: list[Stage]) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources: list[str] = []
    for stage in stages:
        for keyword, rest in stage.instructions:
            if keyword == "COPY" and not rest.startswith("--from"):
                sources.extend(rest.split()[:-1])
    assert sources
    for source in sources:
        path = source.rstrip("/").removeprefix("./")
        assert (ROOT / path).exists(), f"COPY source {source} does not exist"
        assert not _ignored(path, patterns), f"{source} is excluded by .dockerignore"
        if (ROOT / path).is_dir():
            inner = next((ROOT / path).rglob("*.py")).relative_to(ROOT).as_posix()
            assert not _ignored(inner, patterns), f"{inner} is excluded by .dockerignore"
    assert _ignored(".venv", patterns)
    assert _ignored("tests", patterns)


def test_lock_pins_every_runtime_dependency_within_its_specifier() -> None:
    pins = lock.parse_lock((ROOT / "requirements.lock").read_text())
    declared = lock.runtime_requirements(ROOT / "pyproject.toml")
    for req in declared:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, pyproject wants {req.specifier}"
        )


def test_lock_has_no_dev_tools() -> None:
    pins = lock.parse_lock((ROOT / "requirements.lock").read_text())
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for line in dev["dev"]:
        name = canonicalize_name(Requirement(line).name)
        assert name not in pins, f"dev dependency {name} would ship in the image"


def test_lock_parser_rejects_unpinned_lines() -> None:
    with pytest.raises(ValueError, match="NAME==VERSION"):
        lock.parse_lock("grpcio>=1\n")
