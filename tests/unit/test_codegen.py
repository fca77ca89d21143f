"""The committed generated code in dra_gpu/pb is exactly what api/generate.py produces now.

Cases:
- regenerating into an empty temporary folder yields the same set of files, byte for byte
  (catches a .proto edited without `make protos`, a hand-edited generated file, a generated file
  never committed, and a stale one left behind);
- every api/*.proto has its four generated modules (messages, services and both typed stubs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "dra_gpu" / "pb"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generated_files(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in folder.iterdir()
        if p.is_file() and p.name.endswith(SUFFIXES)
    }


def test_regenerated_code_is_identical_to_committed(tmp_path: Path) -> None:
    out = tmp_path / "pb"
    subprocess.run(
        [sys.executable, str(REPO / "api" / "generate.py"), "--out", str(out)],
        cwd=tmp_path,  # the script must not depend on the caller's working directory
        check=True,
        capture_output=True,
    )
    fresh = generated_files(out)
    committed = generated_files(COMMITTED)
    assert sorted(committed) == sorted(fresh), "generated file set differs; run `make protos`"
    differing = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not differing, f"stale generated code, run `make protos`: {differing}"


def test_every_proto_has_its_generated_modules() -> None:
    protos = sorted((REPO / "api").glob("*.proto"))
    assert protos
    expected = {proto.stem + suffix for proto in protos for suffix in SUFFIXES}
    assert set(generated_files(COMMITTED)) == expected
