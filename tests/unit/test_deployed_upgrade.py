"""The pure pieces of ``python -m e2e.deployed --upgrade-from REF`` (the run itself needs root).

Cases:
- ``--upgrade-from`` takes a ref; without it the run is the default one (two builds of this tree);
- the ref's tree is exported as that commit had it (a later commit's files are absent, an edited
  file has its earlier content), with its chart; a ref that names no commit, or a tree without the
  chart, is refused naming the ref;
- the image build of another tree keys its wheels by that tree's lock;
- a node's state directory: every claim held on a node must be in that node's checkpoint.json,
  and one missing, a missing file or one that does not decode is named; the upgrade check reads
  each node's file from that node's state directory.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dra_gpu.prepare.checkpoint import Checkpoint, ClaimRecord, encode
from e2e.deployed import node_state, source
from e2e.deployed.run import parse_args
from e2e.images import driver as driver_image


def test_upgrade_from_takes_a_ref_and_defaults_to_none() -> None:
    assert parse_args([]).upgrade_from is None
    assert parse_args(["--upgrade-from", "435445c"]).upgrade_from == "435445c"


def _git(repo: Path, *args: str) -> str:
    ident = [
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "-c",
        "commit.gpgsign=false",
    ]
    proc = subprocess.run(
        ["git", "-C", str(repo), *ident, *args], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    chart = repo / source.CHART
    chart.mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: dra-gpu\n")
    (repo / "requirements.lock").write_text("hpack==4.2.0\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "previous release")
    _git(repo, "tag", "previous")
    (repo / "requirements.lock").write_text("grpcio-health-checking==1.85.1\n")
    (repo / "new.py").write_text("")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "this release")
    return repo


def test_the_ref_is_exported_as_its_commit_had_it(repo: Path, tmp_path: Path) -> None:
    tree = source.export("previous", tmp_path / "out", repo)
    assert tree.commit == _git(repo, "rev-parse", "previous")
    assert (tree.root / "requirements.lock").read_text() == "hpack==4.2.0\n"
    assert not (tree.root / "new.py").exists()
    assert (tree.chart / "Chart.yaml").is_file()


def test_a_ref_that_names_no_commit_is_refused_naming_it(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(source.RefError, match="'no-such-ref'"):
        source.export("no-such-ref", tmp_path / "out", repo)
    assert not (tmp_path / "out").exists()


def test_a_tree_without_the_chart_is_refused(repo: Path, tmp_path: Path) -> None:
    _git(repo, "rm", "-rq", "manifests")
    _git(repo, "commit", "-qm", "no chart")
    with pytest.raises(source.RefError, match="no chart"):
        source.export("HEAD", tmp_path / "out", repo)


def test_another_trees_lock_gets_its_own_wheels(repo: Path, tmp_path: Path) -> None:
    previous = source.export("previous", tmp_path / "out", repo)
    build = driver_image.build_requirements()
    keys = {
        driver_image.wheels_key(driver_image.lock_requirements(lock), build, "311")
        for lock in (previous.root / "requirements.lock", repo / "requirements.lock")
    }
    assert len(keys) == 2
    assert driver_image.lock_requirements(previous.root / "requirements.lock") == ["hpack==4.2.0"]


def _checkpoint(*uids: str) -> bytes:
    record = ClaimRecord(name="c", namespace="ns", state="PrepareCompleted")
    return encode(Checkpoint(claims={uid: record for uid in uids}))


def test_every_held_claim_must_be_in_its_nodes_checkpoint(tmp_path: Path) -> None:
    files = {"gpu-h200": _checkpoint("a", "b"), "gpu-a100": _checkpoint("c")}
    assert node_state.missing_claims({"gpu-h200": {"a", "b"}, "gpu-a100": {"c"}}, files) == []
    assert node_state.missing_claims({"gpu-h200": {"a", "c"}}, files) == [
        "gpu-h200: checkpoint.json lacks claim c"
    ]


def test_a_missing_or_undecodable_checkpoint_is_named() -> None:
    files: dict[str, bytes | None] = {"gpu-h200": None, "gpu-a100": b"not json"}
    problems = node_state.missing_claims({"gpu-h200": {"a"}, "gpu-a100": {"b"}}, files)
    assert problems[0].startswith("gpu-a100: checkpoint.json does not decode")
    assert problems[1] == "gpu-h200: no checkpoint.json"


def test_the_upgrade_check_reads_each_nodes_checkpoint_from_its_state_dir(tmp_path: Path) -> None:
    from e2e.deployed.run import Checks

    class Env:
        def state_dir(self, node: str) -> Path:
            return tmp_path / node

    for node, uids in {"gpu-h200": ("a", "b"), "gpu-a100": ("c",)}.items():
        (tmp_path / node).mkdir()
        (tmp_path / node / "checkpoint.json").write_bytes(_checkpoint(*uids))
    checks = Checks.__new__(Checks)  # no cluster: only the env's state directories are read
    checks.env = Env()  # type: ignore[assignment]
    assert checks._checkpoints_kept({"gpu-h200": {"a", "b"}, "gpu-a100": {"c"}}) == []
    assert checks._checkpoints_kept({"gpu-a100": {"a"}}) == [
        "gpu-a100: checkpoint.json lacks claim a"
    ]


def test_a_runs_image_archives_are_its_own(tmp_path: Path) -> None:
    # Two runs on one machine: the second's build of e2e-1/e2e-2 replaced the archives the
    # first had not imported yet (a shared cache path), so its nodes ran the wrong images.
    from e2e.deployed.env import DeployedEnv

    first, second = DeployedEnv(workdir=tmp_path / "a"), DeployedEnv(workdir=tmp_path / "b")
    assert first.archive_dir.is_relative_to(first.workdir)
    assert first.archive_dir != second.archive_dir
