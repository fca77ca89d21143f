"""The one runner for the NVIDIA tools prepare calls: ``nvidia-smi``, ``nvidia-cuda-mps-control``.

Every call has a timeout (a wedged driver must not hang prepare) and its output is kept for the
error message. :class:`ProcessRunner` runs the tools; :class:`RecordingRunner` (simulated
nodes) appends each command, one JSON object per line, to a file and answers as a healthy tool
would, so the node tests and the demo can check the exact sequence that a real GPU would get.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

DEFAULT_TIMEOUT_S: Final = 30.0
OUTPUT_TAIL: Final = 2000  # characters of a failed command's output kept in its error

# Where the NVIDIA tools live under a driver root (the GPU Operator's driver container and a
# host install put them in one of these).
TOOL_DIRS: Final = ("usr/bin", "usr/local/nvidia/bin", "bin")


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    stdin: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __str__(self) -> str:
        shown = " ".join(self.argv)
        return f"{shown} <<< {self.stdin.strip()!r}" if self.stdin else shown


class CommandFailed(RuntimeError):
    """A tool failed, timed out or is missing; the message names the command and the reason."""

    def __init__(self, command: Command, reason: str, output: str = "") -> None:
        self.command, self.reason, self.output = command, reason, output
        tail = output.strip()[-OUTPUT_TAIL:]
        super().__init__(f"`{command}` {reason}" + (f": {tail}" if tail else ""))


class Runner(Protocol):
    def run(self, command: Command) -> str:
        """The command's output (stdout and stderr); raises :class:`CommandFailed`."""
        ...


@dataclass(frozen=True)
class ProcessRunner:
    """Runs the tools, found first under ``driver_root`` (then on ``PATH``)."""

    driver_root: Path = Path("/")

    def search_path(self) -> str:
        # On the PATH of the command, not only resolved here: the MPS daemon is started by a
        # shell (in its own mount namespace) that looks it up by name.
        tool_dirs = [str(self.driver_root / sub) for sub in TOOL_DIRS]
        return os.pathsep.join([*tool_dirs, os.environ.get("PATH", os.defpath)])

    def run(self, command: Command) -> str:
        env = {**os.environ, **command.env, "PATH": self.search_path()}
        argv = [shutil.which(command.argv[0], path=env["PATH"]) or command.argv[0]]
        argv += command.argv[1:]
        # Output to a file, not a pipe: the MPS daemon forks off and would keep a pipe open,
        # and the wait would then last until the timeout.
        with tempfile.TemporaryFile() as out:
            try:
                done = subprocess.run(
                    argv,
                    input=command.stdin.encode(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=command.timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                out.seek(0)
                raise CommandFailed(
                    command, f"timed out after {command.timeout_s:g} s", _text(out.read())
                ) from None
            except OSError as exc:
                raise CommandFailed(command, f"cannot run: {exc}") from None
            out.seek(0)
            output = _text(out.read())
        if done.returncode != 0:
            raise CommandFailed(command, f"exited with {done.returncode}", output)
        return output


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


@dataclass
class RecordingRunner:
    """Records each command in ``path`` (JSON lines) instead of running it; answers ``""``."""

    path: Path
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def run(self, command: Command) -> str:
        line = json.dumps(
            {"argv": list(command.argv), "stdin": command.stdin, "env": dict(command.env)},
            sort_keys=True,
        )
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(line + "\n")
        return ""


def recorded(path: Path) -> list[Command]:
    """The commands a :class:`RecordingRunner` wrote to ``path``, in order."""
    if not path.exists():
        return []
    commands = []
    for line in path.read_text().splitlines():
        raw = json.loads(line)
        commands.append(
            Command(argv=tuple(raw["argv"]), stdin=raw.get("stdin", ""), env=raw.get("env", {}))
        )
    return commands
