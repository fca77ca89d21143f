"""GPU health events, and the command file through which they are injected or cleared.

An event says that something happened to one GPU (``HealthEvent``, by GPU UUID): NVML reports
them on real GPUs (``nvml_events``). On every node the plugin also reads a command file,
``<state dir>/health-events.jsonl``, one JSON object per line, appended by
``dra-gpu health inject`` / ``dra-gpu health clear``:

- ``{"device": "gpu-3", "kind": "xid", "code": 79}``: an event on the GPU of device ``gpu-3``
  (a MIG device name means its GPU). Accepted only on simulated nodes: nothing is ever
  injected into a real GPU's health.
- ``{"device": "gpu-3", "clear": true}``: an administrator clears the GPU's taints now, on any
  node (after a repair, or to take back a false alarm).

The file is read from where it ended when the plugin started (commands are not replayed after a
restart); a file that was truncated is read again from its start.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_gpu.devices import health_rules

FILE_NAME = "health-events.jsonl"


@dataclasses.dataclass(frozen=True)
class HealthEvent:
    gpu: str  # GPU UUID
    kind: str  # health_rules.EVENT_KINDS
    code: int = 0  # the XID, or the event's data
    at: float = 0.0  # unix seconds


@dataclasses.dataclass(frozen=True)
class Injected:
    """A simulated event on the GPU of ``device`` (a device name)."""

    device: str
    kind: str
    code: int = 0


@dataclasses.dataclass(frozen=True)
class Clear:
    """Clear the taints of the GPU of ``device`` now."""

    device: str


Command = Injected | Clear


class CommandError(ValueError):
    """A command line that cannot be used; the message says what is wrong."""


def parse_command(doc: Mapping[str, Any]) -> Command:
    device = doc.get("device")
    if not isinstance(device, str) or not device:
        raise CommandError(f"'device' must name a device, got {device!r}")
    if doc.get("clear") is True:
        return Clear(device)
    kind = doc.get("kind")
    if kind not in health_rules.EVENT_KINDS:
        raise CommandError(f"'kind' must be one of {health_rules.EVENT_KINDS}, got {kind!r}")
    code = doc.get("code", 0)
    if isinstance(code, bool) or not isinstance(code, int) or code < 0:
        raise CommandError(f"'code' must be a non-negative integer, got {code!r}")
    if kind == health_rules.XID and code == 0:
        raise CommandError("an xid event needs its XID in 'code'")
    return Injected(device, str(kind), code)


def command_line(command: Command) -> str:
    """The file line for ``command`` (``parse_line`` reads it back)."""
    if isinstance(command, Clear):
        doc: dict[str, Any] = {"device": command.device, "clear": True}
    else:
        doc = {"device": command.device, "kind": command.kind, "code": command.code}
    return json.dumps(doc, sort_keys=True) + "\n"


def parse_line(line: str) -> Command:
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise CommandError(f"not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise CommandError("not a JSON object")
    return parse_command(doc)


def append(path: Path, command: Command) -> None:
    """Append one command; a single ``write`` of a short line, so readers see it whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, command_line(command).encode())
    finally:
        os.close(fd)


class CommandFile:
    """Reads the lines appended to the command file since the last ``read``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = self._size()
        self._partial = b""

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def read(self) -> list[tuple[str, Command | CommandError]]:
        """New complete lines, each with its command or the reason it is unusable."""
        size = self._size()
        if size < self._offset:  # truncated or replaced: read it again from the start
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out: list[tuple[str, Command | CommandError]] = []
        for raw in lines:
            text = raw.decode(errors="replace").strip()
            if not text:
                continue
            try:
                out.append((text, parse_line(text)))
            except CommandError as err:
                out.append((text, err))
        return out
