"""Before and after on one machine at one time: the plugin's CPU per prepare + unprepare cycle,
for two (or more) source trees of dra-gpu run side by side.

Usage: ``.venv/bin/python bench/prepare_ab.py TREE [TREE ...] [--blocks N] [--cycles C]
[--bursts R]``
(e.g. ``bench/prepare_ab.py /work/wt-before .`` with a worktree of the commit before).

``bench/reference.py`` run once per commit compares runs made minutes apart, and on a shared
machine the CPU per cycle moved by up to a third between such runs. Here every tree's plugin
runs at once, each on a node of its own in one local control plane (64 simulated H200, 64 pods
whose claims ask for one GPU each, allocated by the real scheduler), and the blocks of C
sequential cycles alternate between them (the order reversed every block), so each tree meets
the same load. Per tree: the median over the N blocks of the plugin's CPU (user + system, all
threads, from ``/proc``) per cycle, split into user and system, the context switches per cycle,
and the ratio to the first tree. ``--bursts R``: after each block, R rounds of 64 prepares sent
at once (``bench/prepare.at_once``), the median claims/s per tree.

Each plugin runs the tree's own ``dra_gpu``, with the working directory outside every tree:
``python -m`` puts the working directory first on ``sys.path``, so a run started inside a tree
would measure that tree's code for all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.plugin_startup import SliceWatch, rss_mib  # noqa: E402
from bench.prepare import at_once, make_claims  # noqa: E402
from bench.reference import DEVICES, PROFILE, cpu_seconds  # noqa: E402
from dra_gpu import DRIVER_NAME  # noqa: E402
from dra_gpu.controller import classes  # noqa: E402
from dra_gpu.pb import dra_v1_pb2_grpc  # noqa: E402
from e2e import procs  # noqa: E402
from e2e.cluster import Cluster  # noqa: E402
from e2e.driver import PluginDirs, plugin_argv  # noqa: E402
from e2e.kubelet_calls import call  # noqa: E402

WAIT_S = 180.0
WARM_UP = 10  # cycles per plugin before the first block: connections, caches


@dataclass
class Subject:
    tree: Path
    proc: Any  # subprocess.Popen
    stub: Any  # DRAPluginStub
    claims: list[Any]
    cpu_ms: list[float] = field(default_factory=list)
    user_ms: list[float] = field(default_factory=list)
    system_ms: list[float] = field(default_factory=list)
    switches: list[float] = field(default_factory=list)
    burst_rates: list[float] = field(default_factory=list)
    rss: float = 0.0  # MiB, after the last block
    socket: Path = Path()


def times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def context_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def tree_argv(tree: Path, argv: Sequence[str]) -> list[str]:
    """``plugin_argv``'s command with ``python -m dra_gpu`` run from ``tree``'s sources."""
    assert list(argv[1:3]) == ["-m", "dra_gpu"], argv[:3]
    start = (
        f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); "
        "runpy.run_module('dra_gpu', run_name='__main__', alter_sys=True)"
    )
    return [argv[0], "-c", start, *argv[3:]]


def start(
    stack: contextlib.ExitStack, cluster: Cluster, tree: Path, root: Path, node: str, api: Any
) -> Subject:
    profile = root / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    dirs = PluginDirs.under(root)
    cluster.register_node(node)
    argv = plugin_argv(
        node_name=node, kubeconfig=cluster.kubeconfig, profile=str(profile), dirs=dirs
    )
    watch = SliceWatch(api, node, driver=DRIVER_NAME, devices=DEVICES)
    thread = watch.start(watch.clear())
    log = root / "plugin.log"
    env = {"PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:  # where it carries the dependencies (a staged GPU machine)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = procs.spawn(tree_argv(tree, argv), log_path=log, env=env)
    stack.callback(procs.stop, proc, grace_s=10)
    deadline = time.monotonic() + WAIT_S
    while watch.wait(0.2) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{tree}: no slices; log:\n{log.read_text()[-3000:]}")
    thread.join(5)
    claims = make_claims(cluster, node, classes.GPU_CLASS)
    socket = dirs.data / "dra.sock"
    channel = stack.enter_context(grpc.insecure_channel(f"unix://{socket}"))
    return Subject(tree, proc, dra_v1_pb2_grpc.DRAPluginStub(channel), claims, socket=socket)


def block(subject: Subject, cycles: int) -> None:
    pid = subject.proc.pid
    cpu0, (user0, sys0), switches0 = cpu_seconds(pid), times(pid), context_switches(pid)
    for i in range(cycles):
        claim = subject.claims[i % len(subject.claims)]
        call(subject.stub, "prepare", claim)
        call(subject.stub, "unprepare", claim)
    user1, sys1 = times(pid)
    subject.cpu_ms.append((cpu_seconds(pid) - cpu0) * 1e3 / cycles)
    subject.user_ms.append((user1 - user0) * 1e3 / cycles)
    subject.system_ms.append((sys1 - sys0) * 1e3 / cycles)
    subject.switches.append((context_switches(pid) - switches0) / cycles)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="dra-gpu source trees")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per tree")
    parser.add_argument("--cycles", type=int, default=150, help="sequential cycles per block")
    parser.add_argument("--bursts", type=int, default=0, help="64-at-once rounds per block")
    args = parser.parse_args()
    trees = [t.resolve() for t in args.trees]
    for tree in trees:
        if not (tree / "dra_gpu" / "__main__.py").is_file():
            parser.error(f"{tree} is not a dra-gpu source tree (no dra_gpu/__main__.py)")
    suffix = uuid.uuid4().hex[:5]
    os.chdir(tempfile.gettempdir())  # outside every tree: see the module docstring
    loads = [os.getloadavg()[0]]
    with (
        Cluster() as cluster,
        tempfile.TemporaryDirectory(prefix="ab-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        api = cluster.api_client()
        subjects = []
        for i, tree in enumerate(trees):
            root = Path(tmp) / f"t{i}"
            root.mkdir()
            subjects.append(start(stack, cluster, tree, root, f"ab{i}-{suffix}", api))
        for subject in subjects:
            for claim in subject.claims[:WARM_UP]:
                call(subject.stub, "prepare", claim)
                call(subject.stub, "unprepare", claim)
        for n in range(args.blocks):
            for subject in subjects if n % 2 == 0 else subjects[::-1]:
                block(subject, args.cycles)
                subject.burst_rates += [
                    at_once(subject.socket, subject.claims) for _ in range(args.bursts)
                ]
        for subject in subjects:
            subject.rss = rss_mib(subject.proc.pid)
        loads.append(os.getloadavg()[0])
        api.close()
    print(
        f"{args.blocks} blocks of {args.cycles} cycles per tree, alternated; load average "
        f"(1 min) {loads[0]:.2f} at the start, {loads[1]:.2f} at the end, on {os.cpu_count()} CPUs"
    )
    base = statistics.median(subjects[0].cpu_ms)
    print(
        "| tree | CPU per cycle ms (median) | user / system ms | ratio | switches per cycle "
        "| 64 at once, claims/s (median) | RSS after, MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in subjects:
        cpu = statistics.median(s.cpu_ms)
        print(
            f"| {s.tree} | {cpu:.3f} | {statistics.median(s.user_ms):.3f} / "
            f"{statistics.median(s.system_ms):.3f} | {cpu / base:.3f} | "
            f"{statistics.median(s.switches):.1f} | "
            + (f"{statistics.median(s.burst_rates):.0f} |" if s.burst_rates else "- |")
            + f" {s.rss:.1f} |"
        )
    for s in subjects:
        print(f"{s.tree} blocks: " + " ".join(f"{x:.2f}" for x in s.cpu_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
