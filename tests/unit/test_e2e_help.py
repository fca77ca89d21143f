"""Every ``python -m e2e.*`` entry point answers ``--help`` and does nothing else.

``python -m e2e.binaries --help`` used to start a build of the Kubernetes binaries. Each entry
point (a package's ``__main__.py``, a module with a ``__main__`` guard) runs with ``--help``
against an empty binaries cache and a PATH whose first tools (go, apt-get, docker, helm, ...)
only record that they were called: it must exit 0 with a usage text, leave the cache empty and
call none of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What a build or a start would run first; each stub records its call and fails.
TOOLS = ("go", "apt-get", "docker", "dockerd", "helm", "kubectl", "kind", "nvidia-smi", "sudo")
HELP_TIMEOUT_S = 60.0


def entry_points() -> list[str]:
    """Module names ``python -m`` runs: packages with ``__main__.py``, guarded modules."""
    found = []
    for path in sorted((REPO / "e2e").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if path.name == "__main__.py":
            found.append(".".join(parts[:-1]))
        elif 'if __name__ == "__main__":' in path.read_text():
            found.append(".".join(parts))
    return found


@dataclass(frozen=True)
class Answer:
    returncode: int
    output: str
    cache_files: list[str]
    tools_called: str


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Answer]]:
    # All at once: each start imports the kubernetes client, seconds apiece on a busy machine.
    started = {}
    for module in entry_points():
        root = tmp_path_factory.mktemp(module)
        cache, stubs, calls = root / "cache", root / "bin", root / "calls"
        cache.mkdir()
        stubs.mkdir()
        for tool in TOOLS:
            stub = stubs / tool
            stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
            stub.chmod(0o755)
        env = {
            **os.environ,
            "DRA_GPU_CACHE": str(cache),
            "PATH": f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--help"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started[module] = (proc, cache, calls)
    out = {}
    for module, (proc, cache, calls) in started.items():
        try:
            output, _ = proc.communicate(timeout=HELP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            output += f"\n(still running after {HELP_TIMEOUT_S:.0f} s)"
        out[module] = Answer(
            returncode=proc.returncode,
            output=output,
            cache_files=sorted(str(p.relative_to(cache)) for p in cache.rglob("*")),
            tools_called=calls.read_text() if calls.exists() else "",
        )
    yield out


def test_the_known_entry_points_are_found() -> None:
    found = entry_points()
    for module in ("e2e.binaries", "e2e.node.binaries", "e2e.deployed", "e2e.demo", "e2e.helm"):
        assert module in found


@pytest.mark.parametrize("module", entry_points())
def test_help_answers_without_side_effects(answers: dict[str, Answer], module: str) -> None:
    answer = answers[module]
    assert answer.returncode == 0, answer.output
    assert "usage:" in answer.output, answer.output
    assert answer.cache_files == [], f"--help wrote into the cache: {answer.cache_files}"
    assert answer.tools_called == "", f"--help ran: {answer.tools_called}"
