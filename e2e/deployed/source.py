"""An earlier release's source tree, exported from git, for ``--upgrade-from REF``.

The first image and the chart it is installed with come from that tree: its own Dockerfile,
lock and chart with its default values, as a user of that release has them. ``git archive``
(not ``git worktree add``) so the repository gains no worktree to clean up, and the export holds
exactly the commit's tracked files.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from e2e.images.base import REPO_ROOT

CHART = Path("manifests") / "helm" / "dra-gpu"


class RefError(ValueError):
    pass


@dataclass(frozen=True)
class Tree:
    ref: str  # as the user named it
    commit: str
    root: Path

    @property
    def chart(self) -> Path:
        return self.root / CHART


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)


def resolve(ref: str, repo: Path = REPO_ROOT) -> str:
    """The commit ``ref`` names; RefError naming it when it names none."""
    proc = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    if proc.returncode != 0:
        raise RefError(f"--upgrade-from {ref!r}: not a commit of {repo}")
    return proc.stdout.decode().strip()


def export(ref: str, dest: Path, repo: Path = REPO_ROOT) -> Tree:
    """The tracked files of ``ref``'s commit, written under ``dest`` (created)."""
    commit = resolve(ref, repo)
    proc = _git(repo, "archive", "--format=tar", commit)
    if proc.returncode != 0:
        raise RefError(f"git archive {commit}: {proc.stderr.decode().strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        archive.extractall(dest, filter="data")
    if not (dest / CHART / "Chart.yaml").is_file():
        raise RefError(f"--upgrade-from {ref!r}: the tree has no chart at {CHART}")
    return Tree(ref=ref, commit=commit, root=dest)
