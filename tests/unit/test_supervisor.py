"""``e2e.supervisor``: what the cluster and demo supervisors share (no processes started here).

Cases: ``alive`` accepts only a live pid whose command line names the module (not a stale pid,
not another program); ``write_state`` leaves the whole state under its name and nothing aside.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from e2e import supervisor

# The interpreter's path: on this process's command line however pytest was started.
THIS_PROCESS = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()


@pytest.mark.parametrize(
    ("pid", "module", "expected"),
    [
        (os.getpid(), THIS_PROCESS, True),
        (os.getpid(), "e2e.no-such-supervisor", False),
        (2**22 + 1, THIS_PROCESS, False),  # above the kernel's pid_max: never a process
    ],
    ids=["ours", "another-program", "no-such-pid"],
)
def test_alive_names_the_supervisor(pid: int, module: str, expected: bool) -> None:
    assert supervisor.alive(pid, module=module) is expected


def test_write_state_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{stale")
    supervisor.write_state(path, {"pid": 7, "server": "https://127.0.0.1:6443"})
    assert json.loads(path.read_text()) == {"pid": 7, "server": "https://127.0.0.1:6443"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
