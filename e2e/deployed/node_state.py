"""What a node's plugin state directory says about the claims it holds, judged from the host.

The upgrade must take over the earlier version's checkpoint: after it, ``checkpoint.json`` still
holds every claim prepared before (``dra_gpu.prepare.checkpoint`` decodes it, so the check reads
the file as the plugin does).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from dra_gpu.prepare import checkpoint


def read_checkpoint(state_dir: Path) -> bytes | None:
    try:
        return (state_dir / checkpoint.FILE_NAME).read_bytes()
    except FileNotFoundError:
        return None


def missing_claims(
    held: Mapping[str, Collection[str]], files: Mapping[str, bytes | None]
) -> list[str]:
    """One problem per claim UID of ``held`` (node -> UIDs) that the node's checkpoint content
    (``files``: node -> bytes, None when there is no file) does not hold."""
    problems = []
    for node, uids in sorted(held.items()):
        data = files.get(node)
        if data is None:
            problems.append(f"{node}: no {checkpoint.FILE_NAME}")
            continue
        try:
            claims = checkpoint.decode(data).claims
        except Exception as exc:  # ValueError, or the checkpoint's own "too new" error
            problems.append(f"{node}: {checkpoint.FILE_NAME} does not decode: {exc}")
            continue
        problems += [
            f"{node}: {checkpoint.FILE_NAME} lacks claim {uid}"
            for uid in sorted(uids)
            if uid not in claims
        ]
    return problems
