"""What a durable checkpoint write costs: the fsynced rename, alone and inside the store.

Usage: ``.venv/bin/python bench/durable_write.py [--count 500] [--rounds 5] [--claims 64]
[--dir PATH]``

In a temp directory under ``--dir`` (default ``/var/tmp``: a disk, not tmpfs; give the state
directory's file system to measure that one), a checkpoint holding ``--claims`` records is
written ``--count`` times per round, alternating the two ways round by round:

1. ``fsynced rename``: ``atomicfile.write_atomic(durable=True)`` (temp file, ``fsync``,
   ``rename``, directory ``fsync``), the durable write itself;
2. ``store update``: ``CheckpointStore.update(durable=True)`` of one claim record, what a prepare
   waits for: the file lock, the read (from memory, the file unchanged), the mutation, encoding,
   the write token and the fsynced rename;
3. ``rename, no fsync``: ``atomicfile.write_atomic(durable=False)``, what a write that is not
   durable costs, i.e. what the fsyncs add.

Prints the median over rounds of the wall ms per write (p50 and p99 within the round).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dra_gpu.kubeletplugin import atomicfile  # noqa: E402
from dra_gpu.prepare import checkpoint  # noqa: E402


def record() -> checkpoint.ClaimRecord:
    # One full-GPU record as prepare writes it (about 580 bytes of JSON each).
    return checkpoint.ClaimRecord.model_validate(
        {
            "state": checkpoint.PREPARE_COMPLETED,
            "namespace": "default",
            "name": "c",
            "devices": [
                {
                    "request_names": ["gpu"],
                    "pool": "node-a",
                    "device": "gpu-0",
                    "cdi_device_ids": ["k8s.gpu.nvidia.com/claim=0123-gpu-0"],
                    "type": "gpu",
                    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                    "minor": 0,
                    "product_name": "NVIDIA H200",
                }
            ],
        }
    )


def content(claims: int) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(claims={f"uid-{n:04d}": record() for n in range(claims)})


def renamed(directory: Path, data: bytes, *, durable: bool) -> Callable[[int], None]:
    path = directory / "checkpoint.json"
    directory.mkdir(parents=True)
    return lambda _: atomicfile.write_atomic(path, data, durable=durable)


def store_update(directory: Path, start: checkpoint.Checkpoint) -> Callable[[int], None]:
    """Each write records one more claim (then drops it again), as a prepare and an unprepare do;
    the checkpoint keeps the size of ``start`` give or take one record."""
    store = checkpoint.CheckpointStore(directory)
    store.update(lambda cp: start.model_copy(update={"generation": cp.generation}), durable=True)
    claim = record()

    def write(n: int) -> None:
        uid = "bench-claim"
        if n % 2:
            store.update(lambda cp: cp.without_claim(uid), durable=True)
        else:
            store.update(lambda cp: cp.with_claim(uid, claim), durable=True)

    return write


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--claims", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    start = content(args.claims)
    data = checkpoint.encode(start)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="durable-write-") as tmp:
        ways = {
            "fsynced rename": renamed(Path(tmp) / "a", data, durable=True),
            "store update": store_update(Path(tmp) / "b", start),
            "rename, no fsync": renamed(Path(tmp) / "c", data, durable=False),
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for r in range(args.rounds):
            for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                write = ways[name]
                for n in range(20):  # warm-up: files created, the store's first read done
                    write(n)
                times = []
                for n in range(args.count):
                    started = time.perf_counter()
                    write(1000 + n)
                    times.append((time.perf_counter() - started) * 1e3)
                times.sort()
                results[name].append((times[len(times) // 2], times[int(len(times) * 0.99)]))
    print(
        f"checkpoint of {args.claims} claims: {len(data)} bytes; {args.count} writes x "
        f"{args.rounds} rounds in {args.dir}"
    )
    print("| write | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for name, rounds in results.items():
        p50 = statistics.median(r[0] for r in rounds)
        p99 = statistics.median(r[1] for r in rounds)
        print(f"| {name} | {p50:.3f} | {p99:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
