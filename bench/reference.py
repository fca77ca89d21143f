"""dra-gpu against the Go reference kubelet plugin, side by side on one harness.

Usage: ``.venv/bin/python bench/reference.py [--samples N] [--rounds R] [--passes P]``

The reference is the DRA example driver (``sigs.k8s.io/dra-example-driver``, the version
pinned in ``bench/gomod/dra-example-driver/go.mod``), built from its Go module into the binaries
cache (``<cache>/dra-example-driver-<version>/``, same build lock as the Kubernetes binaries).
Its code never enters this repository: only the wrapper module that requires it.

Set-up (not timed): one local control plane (``e2e.cluster.Cluster``) with the real scheduler;
one node per plugin with 64 devices (dra-gpu: 64 simulated H200; the reference:
``--num-devices 64``, client QPS limit raised so it is not throttled); per node 64 pods whose
claim asks for one device, allocated by the scheduler. The benchmark acts as the kubelet over
each plugin's DRA socket with the same gRPC client (``bench/prepare.py``). Both log at the
level they are deployed with (dra-gpu INFO: two lines per prepare + unprepare cycle; the
reference at its default verbosity: four).

Each pass measures both plugins, the order alternating between passes. Per plugin and pass:

- start -> all 64 devices published (the node's slices deleted first; a watch sees them);
- N sequential prepare + unprepare cycles (latency p50/p99; CPU of the plugin process per
  cycle from /proc/<pid>/stat);
- R rounds of 64 prepares at once, 3R rounds of 8 prepares at once, R rounds of 64 unprepares
  at once (claims/s, median);
- RSS after those;
- then, restarted with a pod UID (rolling-update mode, as the chart deploys it: calls
  serialized node-wide), R rounds of 64 prepares at once.

Then, paired (``--paired N``, default 600): both plugins running at once, N cycles that
alternate between them (the first of each pair flipping every cycle), so that each pair of
samples meets the same machine; a busy 2-core machine moves one pass's latencies by 10-20 %
against the next, while the pairs agree within a few per cent.

Prints one table over all passes (latencies: percentiles of all samples; CPU, claims/s, start:
medians; RSS: the largest), with ratios dra-gpu / reference (below 1.0 is better for dra-gpu in
every row except claims/s, where above 1.0 is). Defaults: 4 passes of 300 cycles, i.e. 1,200
sequential samples per plugin.
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.plugin_startup import SliceWatch, rss_mib  # noqa: E402
from bench.prepare import at_once, latency, make_claims, pct  # noqa: E402
from dra_gpu import DRIVER_NAME  # noqa: E402
from dra_gpu.controller import classes  # noqa: E402
from dra_gpu.pb import dra_v1_pb2_grpc  # noqa: E402
from e2e import binaries, procs  # noqa: E402
from e2e.cluster import Cluster  # noqa: E402
from e2e.driver import PluginDirs, plugin_argv  # noqa: E402
from e2e.kube_json import as_body  # noqa: E402
from e2e.kubelet_calls import call  # noqa: E402

DEVICES = 64
REFERENCE_MODULE = "sigs.k8s.io/dra-example-driver"
REFERENCE_GOMOD = ROOT / "bench" / "gomod" / "dra-example-driver"
REFERENCE_BINARY = "dra-example-kubeletplugin"
REFERENCE_DRIVER = "gpu.example.com"
WAIT_S = 180.0
PROFILE = {"gpus": [{"product": "H200-141GB", "count": DEVICES}]}


def reference_binary() -> Path:
    """The reference plugin, built once per pinned version into the binaries cache."""
    version = binaries.module_version(REFERENCE_GOMOD / "go.mod", REFERENCE_MODULE)
    out = binaries.cache_root() / f"dra-example-driver-{version}"
    binaries.build_missing(
        out,
        [REFERENCE_BINARY],
        src=lambda: REFERENCE_GOMOD,
        argv=lambda tmp, _: [
            *("go", "build", "-v", "-ldflags", "-s -w"),
            *("-o", str(tmp / REFERENCE_BINARY), f"{REFERENCE_MODULE}/cmd/{REFERENCE_BINARY}"),
        ],
        env={**os.environ, "CGO_ENABLED": "0"},
        label=version,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    return out / REFERENCE_BINARY


@dataclass(frozen=True)
class Subject:
    """One plugin under test: how to start it and where its DRA socket is."""

    name: str
    driver: str
    device_class: str
    node: str
    command: Callable[[Path, str | None], tuple[list[str], Path]]  # (root, pod UID) -> argv, socket


def dra_gpu(cluster: Cluster, node: str, profile: Path) -> Subject:
    def command(root: Path, pod_uid: str | None) -> tuple[list[str], Path]:
        dirs = PluginDirs.under(root)
        extra = ["--pod-uid", pod_uid] if pod_uid else []
        argv = plugin_argv(
            node_name=node,
            kubeconfig=cluster.kubeconfig,
            profile=str(profile),
            dirs=dirs,
            extra=extra,
        )
        return argv, dirs.data / (f"dra-{pod_uid}.sock" if pod_uid else "dra.sock")

    return Subject("dra-gpu", DRIVER_NAME, classes.GPU_CLASS, node, command)


def reference(cluster: Cluster, node: str, binary: Path) -> Subject:
    def command(root: Path, pod_uid: str | None) -> tuple[list[str], Path]:
        (root / "registry").mkdir(parents=True, exist_ok=True)  # it binds there, creates nothing
        argv = [
            *(str(binary), "--node-name", node, "--kubeconfig", str(cluster.kubeconfig)),
            *("--cdi-root", str(root / "cdi"), "--num-devices", str(DEVICES)),
            *("--kubelet-registrar-directory-path", str(root / "registry")),
            *("--kubelet-plugins-directory-path", str(root / "plugins")),
            *("--kube-api-qps", "1000", "--kube-api-burst", "1000"),
            *(["--pod-uid", pod_uid] if pod_uid else []),
        ]
        data = root / "plugins" / REFERENCE_DRIVER
        return argv, data / (f"dra-{pod_uid}.sock" if pod_uid else "dra.sock")

    return Subject("Go example", REFERENCE_DRIVER, REFERENCE_DRIVER, node, command)


def reference_class() -> dict[str, Any]:
    selector = {"cel": {"expression": f"device.driver == '{REFERENCE_DRIVER}'"}}
    return {"metadata": {"name": REFERENCE_DRIVER}, "spec": {"selectors": [selector]}}


@dataclass
class Figures:
    prepare_ms: list[float] = field(default_factory=list)
    unprepare_ms: list[float] = field(default_factory=list)
    cpu_ms_per_cycle: list[float] = field(default_factory=list)
    prepare_rate: list[float] = field(default_factory=list)
    prepare_rate_8: list[float] = field(default_factory=list)
    rolling_prepare_rate: list[float] = field(default_factory=list)
    unprepare_rate: list[float] = field(default_factory=list)
    start_ms: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    paired_prepare_ms: list[float] = field(default_factory=list)
    paired_unprepare_ms: list[float] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def running(
    subject: Subject, root: Path, watch: SliceWatch, pod_uid: str | None
) -> Iterator[tuple[Any, Path, float]]:
    """The plugin started on a node without slices; yields (process, socket, ms to publish)."""
    argv, socket = subject.command(root, pod_uid)
    thread = watch.start(watch.clear())
    time.sleep(0.3)  # let the watch connect before the clock starts
    log_path = root / f"{subject.node}.log"
    started = time.monotonic()
    # A bare environment, as both plugins would have in a pod; PYTHONPATH stays where it
    # carries the dependencies (a staged GPU machine: e2e/gpu/remote.sh bench).
    env = {"PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = procs.spawn(argv, log_path=log_path, env=env)
    try:
        deadline = started + WAIT_S
        seen = None
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            seen = watch.wait(0.2)
        if seen is None:
            raise RuntimeError(f"{subject.name}: no slices; log:\n{log_path.read_text()[-3000:]}")
        thread.join(5)
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=WAIT_S)
        yield proc, socket, (seen - started) * 1e3
    finally:
        procs.stop(proc, grace_s=10)


def measure(
    subject: Subject, root: Path, api: Any, claims: Sequence[Any], args: argparse.Namespace
) -> Figures:
    figures = Figures()
    watch = SliceWatch(api, subject.node, driver=subject.driver, devices=DEVICES)
    with running(subject, root, watch, None) as (proc, socket, start_ms):
        figures.start_ms.append(start_ms)
        cpu0 = cpu_seconds(proc.pid)
        prepare_ms, unprepare_ms = latency(socket, claims, args.samples)
        cycles = args.samples + 5  # latency() also runs 5 warm-up cycles
        figures.cpu_ms_per_cycle.append((cpu_seconds(proc.pid) - cpu0) * 1e3 / cycles)
        figures.prepare_ms += prepare_ms
        figures.unprepare_ms += unprepare_ms
        figures.prepare_rate += [at_once(socket, claims) for _ in range(args.rounds)]
        # Eight pods starting at once: a short burst, so three times the rounds.
        figures.prepare_rate_8 += [at_once(socket, claims[:8]) for _ in range(3 * args.rounds)]
        figures.unprepare_rate += [at_once(socket, claims, "unprepare") for _ in range(args.rounds)]
        figures.rss_mib.append(rss_mib(proc.pid))
    with running(subject, root, watch, str(uuid.uuid4())) as (proc, socket, _):
        figures.rolling_prepare_rate += [at_once(socket, claims) for _ in range(args.rounds)]
    return figures


def paired(
    subjects: Sequence[Subject],
    roots: dict[str, Path],
    api: Any,
    claims: dict[str, list[Any]],
    cycles: int,
    figures: dict[str, Figures],
) -> None:
    """Both plugins up; ``cycles`` prepare + unprepare cycles alternating between them."""
    with contextlib.ExitStack() as stack:
        stubs = {}
        for subject in subjects:
            watch = SliceWatch(api, subject.node, driver=subject.driver, devices=DEVICES)
            _, socket, _ = stack.enter_context(running(subject, roots[subject.name], watch, None))
            channel = stack.enter_context(grpc.insecure_channel(f"unix://{socket}"))
            stubs[subject.name] = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for i in range(cycles + 10):
            for subject in subjects if i % 2 == 0 else subjects[::-1]:
                claim = claims[subject.name][i % len(claims[subject.name])]
                t0 = time.perf_counter()
                call(stubs[subject.name], "prepare", claim)
                t1 = time.perf_counter()
                call(stubs[subject.name], "unprepare", claim)
                t2 = time.perf_counter()
                if i >= 10:  # warm-up
                    figures[subject.name].paired_prepare_ms.append((t1 - t0) * 1e3)
                    figures[subject.name].paired_unprepare_ms.append((t2 - t1) * 1e3)


def merge(into: Figures, more: Figures) -> None:
    for name, values in vars(more).items():
        getattr(into, name).extend(values)


def table(ours: Figures, theirs: Figures) -> str:
    def row(label: str, a: Sequence[float], b: Sequence[float], fmt: str = "{:.2f}") -> str:
        if not a or not b:
            return f"| {label} | not measured | not measured | |"
        ratios = " / ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True))
        left = " / ".join(fmt.format(x) for x in a)
        right = " / ".join(fmt.format(y) for y in b)
        return f"| {label} | {left} | {right} | {ratios} |"

    def tail(samples: Sequence[float]) -> list[float]:
        return [pct(samples, 0.5), pct(samples, 0.99)] if samples else []  # e.g. --paired 0

    def med(samples: Sequence[float]) -> list[float]:
        return [statistics.median(samples)] if samples else []

    return "\n".join(
        [
            "| figure | dra-gpu | Go example | ratio |",
            "|---|---:|---:|---:|",
            row("prepare p50 / p99 ms", tail(ours.prepare_ms), tail(theirs.prepare_ms)),
            row("unprepare p50 / p99 ms", tail(ours.unprepare_ms), tail(theirs.unprepare_ms)),
            row(
                "paired: prepare p50 / p99 ms",
                tail(ours.paired_prepare_ms),
                tail(theirs.paired_prepare_ms),
            ),
            row(
                "paired: unprepare p50 / p99 ms",
                tail(ours.paired_unprepare_ms),
                tail(theirs.paired_unprepare_ms),
            ),
            row(
                "plugin CPU per prepare+unprepare ms",
                med(ours.cpu_ms_per_cycle),
                med(theirs.cpu_ms_per_cycle),
            ),
            row(
                f"{DEVICES} at once, prepare claims/s",
                med(ours.prepare_rate),
                med(theirs.prepare_rate),
                "{:.0f}",
            ),
            row(
                "8 at once, prepare claims/s",
                med(ours.prepare_rate_8),
                med(theirs.prepare_rate_8),
                "{:.0f}",
            ),
            row(
                "same, in rolling-update mode (pod UID)",
                med(ours.rolling_prepare_rate),
                med(theirs.rolling_prepare_rate),
                "{:.0f}",
            ),
            row(
                f"{DEVICES} at once, unprepare claims/s",
                med(ours.unprepare_rate),
                med(theirs.unprepare_rate),
                "{:.0f}",
            ),
            row(
                "start -> all devices published ms",
                med(ours.start_ms),
                med(theirs.start_ms),
                "{:.0f}",
            ),
            row("RSS after the run MiB", [max(ours.rss_mib)], [max(theirs.rss_mib)], "{:.1f}"),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="sequential cycles per pass")
    parser.add_argument("--rounds", type=int, default=3, help="64-at-once rounds per pass")
    parser.add_argument("--passes", type=int, default=4, help="passes over both plugins")
    parser.add_argument("--paired", type=int, default=600, help="alternated cycles, both up")
    args = parser.parse_args()
    binary = reference_binary()
    suffix = uuid.uuid4().hex[:6]
    loads: list[float] = []
    with Cluster() as cluster, tempfile.TemporaryDirectory(prefix="rb-") as tmp:
        profile = Path(tmp) / "bench-64.json"
        profile.write_text(json.dumps(PROFILE))
        subjects = [
            dra_gpu(cluster, f"ours-{suffix}", profile),
            reference(cluster, f"ref-{suffix}", binary),
        ]
        api = cluster.api_client()
        from kubernetes import client

        client.ResourceV1Api(api).create_device_class(as_body(reference_class()))
        figures = {s.name: Figures() for s in subjects}
        claims: dict[str, list[Any]] = {}
        for n in range(args.passes):
            for subject in subjects if n % 2 == 0 else subjects[::-1]:
                root = Path(tmp) / subject.name.replace(" ", "-")
                root.mkdir(exist_ok=True)
                if subject.name not in claims:
                    cluster.register_node(subject.node)
                    # Claims are allocated against the published slices: the plugin must run.
                    watch = SliceWatch(api, subject.node, driver=subject.driver, devices=DEVICES)
                    with running(subject, root, watch, None):
                        claims[subject.name] = make_claims(
                            cluster, subject.node, subject.device_class
                        )
                loads.append(os.getloadavg()[0])
                measured = measure(subject, root, api, claims[subject.name], args)
                merge(figures[subject.name], measured)
                print(f"pass {n + 1}: {subject.name} done", file=sys.stderr, flush=True)
        roots = {s.name: Path(tmp) / s.name.replace(" ", "-") for s in subjects}
        loads.append(os.getloadavg()[0])
        paired(subjects, roots, api, claims, args.paired, figures)
        api.close()
    ours, theirs = (figures[s.name] for s in subjects)
    print(
        f"{args.passes} passes, {args.samples} cycles and {args.rounds} rounds per pass and "
        f"plugin, then {args.paired} paired cycles; load average (1 min) at the passes and the "
        f"pairs: {', '.join(f'{x:.2f}' for x in loads)} on {os.cpu_count()} CPUs"
    )
    print(table(ours, theirs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
