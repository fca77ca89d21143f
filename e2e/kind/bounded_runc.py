#!/usr/bin/python3
"""runc, given only the capabilities this process can hold: the kit's Docker runtime.

Docker gives a ``--privileged`` container every capability the kernel knows. Where the machine
itself runs with a smaller bounding set (this one has no CAP_SYS_RESOURCE), runc then fails
every privileged container (``unable to apply caps: operation not permitted``), and kind's nodes
are privileged containers (and ``docker exec --privileged`` fails alike). Before ``create``/``run``
(the bundle's ``config.json``) and ``exec`` (its ``--process`` file), this wrapper drops the
capabilities outside this process's bounding set, then runs runc with the same arguments.
Where nothing is missing it changes nothing. Standard library only: dockerd's shim runs it with
the system Python.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RUNC = "/usr/sbin/runc"
# capability(7) numbers 0..40, in order.
CAPABILITIES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]


def bounding_set(status: str) -> set[str]:
    """``CAP_*`` names in the ``CapBnd`` mask of a ``/proc/<pid>/status`` text."""
    mask = int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), 16
    )
    return {f"CAP_{name}" for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1}


def bounded(process: dict[str, object], allowed: set[str]) -> dict[str, object]:
    """An OCI ``process`` object with every capability set cut to ``allowed``."""
    caps = process.get("capabilities")
    if not isinstance(caps, dict):
        return process
    return {**process, "capabilities": {k: [c for c in v if c in allowed] for k, v in caps.items()}}


def _option(argv: list[str], names: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        for name in names:
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    return None


def spec_of(argv: list[str]) -> tuple[Path, bool] | None:
    """The JSON file a runc command line starts a process from, and whether it is a whole
    runtime spec (``create``/``run``: the bundle's config.json) or a bare process (``exec
    --process``); None for the other commands."""
    if {"create", "run"} & set(argv):
        return Path(_option(argv, ("--bundle", "-b")) or Path.cwd()) / "config.json", True
    if "exec" in argv:
        process = _option(argv, ("--process", "-p"))
        return (Path(process), False) if process else None
    return None


def main() -> None:
    if sys.argv[1:] in (["--help"], ["-h"]):
        # Asked by a person (dockerd never asks): what this wrapper is, not runc's own help.
        print(f"usage: {sys.argv[0]} RUNC-ARGUMENTS...\n\n{__doc__}")
        return
    found = spec_of(sys.argv[1:])
    if found is not None and found[0].is_file():
        path, whole = found
        data = json.loads(path.read_text())
        allowed = bounding_set(Path("/proc/self/status").read_text())
        if whole and isinstance(data.get("process"), dict):
            data = {**data, "process": bounded(data["process"], allowed)}
        elif not whole:
            data = bounded(data, allowed)
        path.write_text(json.dumps(data))
    os.execv(RUNC, [RUNC, *sys.argv[1:]])


if __name__ == "__main__":
    main()
