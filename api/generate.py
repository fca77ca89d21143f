"""Regenerate the Python protobuf/gRPC modules in dra_gpu/pb from api/*.proto.

Usage: ``.venv/bin/python api/generate.py [--out DIR]`` (``make protos``).

Design and invariants:
- protoc runs in-process from grpcio-tools, so the protoc version is pinned by the dev
  dependencies and not by whatever protoc happens to be on PATH.
- ``api/`` is mapped to the virtual directory ``dra_gpu/pb`` (``-Idra_gpu/pb=api``), so the
  generated modules import each other as ``dra_gpu.pb.x_pb2`` and the descriptor file names are
  ``dra_gpu/pb/x.proto`` no matter where the checkout lives.
- Four outputs per .proto: messages (``_pb2.py``), services (``_pb2_grpc.py``) and their typed
  stubs (``_pb2.pyi``, ``_pb2_grpc.pyi``, from mypy-protobuf) so ``mypy --strict`` can check users.
- Output is a pure function of the .proto files and the pinned tool versions: protoc writes into
  an empty temporary folder and only the generated files are copied out. Stale generated files in
  the target folder are removed; hand-written files there (``__init__.py``) are left alone.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]  # ships no type information

REPO = Path(__file__).resolve().parent.parent
API_DIR = REPO / "api"
PACKAGE_DIR = "dra_gpu/pb"
DEFAULT_OUT = REPO / PACKAGE_DIR
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


def is_generated(path: Path) -> bool:
    """True for a file name this script produces (and may therefore delete)."""
    return path.is_file() and path.name.endswith(GENERATED_SUFFIXES)


def find_plugin(name: str) -> Path:
    # Prefer the plugin installed next to this interpreter (the project venv) so a foreign
    # mypy-protobuf on PATH cannot change the output.
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"generate: protoc plugin {name!r} not found; install mypy-protobuf")
    return Path(found)


def protoc_args(protos: list[Path], out: Path) -> list[str]:
    args = ["grpc_tools.protoc", f"-I{PACKAGE_DIR}={API_DIR}"]
    for plugin in PLUGINS:
        args.append(f"--plugin={plugin}={find_plugin(plugin)}")
    args += [f"--python_out={out}", f"--grpc_python_out={out}"]
    # "quiet" stops mypy-protobuf from printing one line per file it writes.
    args += [f"--mypy_out=quiet:{out}", f"--mypy_grpc_out=quiet:{out}"]
    args.extend(f"{PACKAGE_DIR}/{proto.name}" for proto in protos)
    return args


def generate_into(scratch: Path) -> list[Path]:
    """Runs protoc on every api/*.proto into ``scratch``; returns the generated files."""
    protos = sorted(API_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"generate: no .proto files in {API_DIR}")
    status = protoc.main(protoc_args(protos, scratch))
    if status != 0:
        raise SystemExit(f"generate: protoc failed with status {status}")
    return sorted(p for p in (scratch / PACKAGE_DIR).iterdir() if is_generated(p))


def install(generated: list[Path], out: Path) -> None:
    """Copies the generated files into ``out`` and removes generated files no longer produced."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = {p.name for p in generated}
    for old in sorted(out.iterdir()):
        if is_generated(old) and old.name not in wanted:
            old.unlink()
    for src in generated:
        dst = out / src.name
        data = src.read_bytes()
        # Leave unchanged files untouched so their mtimes (and tool caches) stay valid.
        if not dst.is_file() or dst.read_bytes() != data:
            dst.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"target folder (default: {PACKAGE_DIR})"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-protos-") as tmp:
        generated = generate_into(Path(tmp))
        install(generated, args.out)
    print(f"generated {len(generated)} files into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
