"""A node's cgroup is made on v1, hybrid and v2-only hosts (the GPU machines are v2 only).

Cases, on directories laid out as each hierarchy looks: a v1 cpuset child gets its parent's CPUs
and memory nodes (else it refuses tasks); a v2 child under the root, which has no
``cpuset.cpus`` of its own, is created and left to inherit (copying would fail).
"""

from __future__ import annotations

from pathlib import Path

from e2e.node.cleanup import create_in_hierarchy


def _child_knobs(directory: Path) -> None:
    # The kernel creates these (empty) in a new cgroup; a plain directory does not.
    for knob in ("cpuset.cpus", "cpuset.mems"):
        (directory / knob).write_text("")


def test_a_v1_cpuset_child_gets_the_parents_cpus(tmp_path: Path) -> None:
    (tmp_path / "cpuset.cpus").write_text("0-15\n")
    (tmp_path / "cpuset.mems").write_text("0\n")
    child = tmp_path / "dra-gpu-node-1"
    child.mkdir()
    _child_knobs(child)
    assert create_in_hierarchy(tmp_path, "/dra-gpu-node-1") == child
    assert (child / "cpuset.cpus").read_text() == "0-15\n"
    assert (child / "cpuset.mems").read_text() == "0\n"


def test_a_v2_child_of_the_root_is_created_and_inherits(tmp_path: Path) -> None:
    (tmp_path / "cpuset.cpus.effective").write_text("0-15\n")  # the v2 root has only this
    child = tmp_path / "dra-gpu-node-2"
    child.mkdir()
    _child_knobs(child)
    create_in_hierarchy(tmp_path, "dra-gpu-node-2")
    assert (child / "cpuset.cpus").read_text() == ""
