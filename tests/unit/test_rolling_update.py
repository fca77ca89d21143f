"""Rolling update: two plugin instances overlap on one node while prepares keep coming.

Both are real ``NodePlugin`` instances in rolling-update mode (real unix sockets, the real
node-wide call lock on real lock files, the real prepare transaction) sharing the CDI and state
directories; the API server is a fake. The two instances of a test live in one process, but
each has its own open lock files, so their flocks conflict exactly as two processes' do.

``test_overlapping_starts_lose_no_acknowledged_prepare``: each round starts a new instance (with
its start-up recovery) while the previous one is still serving prepare and unprepare calls, then
stops the previous one, as a DaemonSet rolling update with ``maxSurge`` does. Client threads
prepare claims through whichever instances serve, keep each acknowledged claim a while, check
that its CDI spec and completed record are still there, then unprepare it.

``test_a_new_instance_serves_within_its_bound_while_the_old_one_is_busy`` (issue 41): eight
clients prepare and unprepare in a loop without pause on the old instance while a new one starts
(recovery under the node lock, then serving) and stops again, 40 times. The busy instance must
not starve the new one: each start answers a prepare through its own socket within
:data:`SERVE_WITHIN_S`. The old lock let the busy instance's calls keep joining its turn, so the
new one's recovery waited for a moment with no call inside, which this load rarely leaves: on a
2-core machine 7, 25 and 36 of 40 starts missed the bound in three runs (and a new instance's
unprepare failed after the lock's 120 s), against a slowest start of 0.1 to 0.6 s with the
turnstile (the commit that added this test has the runs).

Cases, over ``DRA_GPU_ROLLING_STARTS`` starts each (40 by default; set it higher for a longer
run, e.g. ``DRA_GPU_ROLLING_STARTS=400 .venv/bin/pytest -s tests/unit/test_rolling_update.py``):
- no acknowledged prepare loses its spec or record;
- ``checkpoint.json``, read as an operator reads it (no lock) right after each answer, has the
  completed record of each acknowledged prepare and none of each acknowledged unprepare (and the
  spec file is there, then gone, in the busy-instance test);
- (busy instance) every start serves within the bound.
The figures (starts, their times, prepares acknowledged, lost, not in the file when answered)
are printed; ``-s`` shows them.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fake_claims import FakeFetcher, claim, device_state, inventory, result
from fake_slice_store import FakeSliceStore
from plugin_start import start_serving
from test_kubelet_plugin_grpc import TIMEOUT_S, make_settings

from dra_gpu.kubeletplugin import call_lock
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc
from dra_gpu.plugin import node_plugin
from dra_gpu.plugin import settings as plugin_settings
from dra_gpu.prepare import cdi
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, Checkpoint, CheckpointStore

STARTS = int(os.environ.get("DRA_GPU_ROLLING_STARTS", "40"))
CLIENTS = 6
KEEP = 8  # acknowledged claims each client holds (and checks) before unpreparing the oldest
OVERLAP_S = 0.05  # both instances serve for this long after the new one is up
LOOP_CLIENTS = 8  # on the busy old instance
SERVE_WITHIN_S = 15.0  # from a start to its first answered prepare, under that load
STUCK_S = call_lock.TIMEOUT_S + 2 * TIMEOUT_S  # a start that missed the bound, once unloaded
INVENTORY = inventory()
GPUS = sorted(n for n, d in INVENTORY.items() if d.type == "gpu")


class Node:
    """The shared directories, the fake API, and the instances serving right now."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetcher = FakeFetcher()
        self.devices = list(INVENTORY.values())
        self.live: list[plugin_settings.Settings] = []
        self.plugins: dict[str, node_plugin.NodePlugin] = {}
        self.call_locks: dict[str, call_lock.NodeCallLock] = {}
        self.live_lock = threading.Lock()

    def start_instance(self, n: int) -> plugin_settings.Settings:
        settings = make_settings(self.root, "--pod-uid", f"uid-{n}")
        lock = call_lock.NodeCallLock(plugin_settings.socket_paths(settings).lock)
        self.call_locks[str(settings.pod_uid)] = lock
        state = device_state(
            self.root,
            devices=INVENTORY,
            claims=self.fetcher,
            boot_id=lambda: "boot",
            call_lock=lock,
        )
        plugin = node_plugin.NodePlugin(
            settings,
            store=FakeSliceStore(),
            devices=self.devices,
            instance=node_plugin.this_instance(settings),
        )
        self.plugins[str(settings.pod_uid)] = plugin
        start_serving(plugin, state)
        return settings

    def stop_instance(self, settings: plugin_settings.Settings) -> None:
        self.plugins.pop(str(settings.pod_uid)).stop()

    def pick(self) -> Path | None:
        with self.live_lock:
            return plugin_settings.socket_paths(random.choice(self.live)).dra if self.live else None


def claim_msg(uid: str) -> dra_v1_pb2.Claim:
    return dra_v1_pb2.Claim(uid=uid, namespace="default", name=f"claim-{uid}")


class Client(threading.Thread):
    def __init__(self, node: Node, index: int, stop: threading.Event) -> None:
        super().__init__(name=f"client-{index}", daemon=True)
        self.node, self.index, self.stop = node, index, stop
        self.acknowledged = 0
        self.lost: list[str] = []
        self.not_in_file: list[str] = []  # the file did not agree with an answer just given
        self.errors: list[str] = []
        self.held: deque[str] = deque()
        self.channels: dict[Path, grpc.Channel] = {}

    def call(self, fn: str, uid: str) -> str | None:
        """The claim's error ("" on success), None when no instance answered."""
        socket = self.node.pick()
        if socket is None:
            return None
        ch = self.channels.get(socket)
        if ch is None:
            ch = self.channels[socket] = grpc.insecure_channel(f"unix:{socket}")
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        try:
            if fn == "prepare":
                reply = stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(uid)]),
                    timeout=TIMEOUT_S,
                )
                entry = reply.claims[uid]
                return entry.error or ("" if entry.devices else "no devices")
            released = stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim_msg(uid)]),
                timeout=TIMEOUT_S,
            )
            return str(released.claims[uid].error)
        except grpc.RpcError:
            return None  # that instance stopped meanwhile; the kubelet would retry

    def check(self, uid: str) -> None:
        spec = cdi.spec_path(self.node.root / "cdi", ClaimUID(uid)).exists()
        record = CheckpointStore(self.node.root / "state").load().claims.get(uid)
        if not spec or record is None or record.state != PREPARE_COMPLETED:
            self.lost.append(f"{uid}: spec {'present' if spec else 'missing'}, record {record}")

    def check_file(self, uid: str, *, prepared: bool) -> None:
        """``checkpoint.json`` as it is on disk, read without the checkpoint's lock."""
        path = self.node.root / "state" / "checkpoint.json"
        record = Checkpoint.model_validate_json(path.read_bytes()).claims.get(uid)
        if prepared and (record is None or record.state != PREPARE_COMPLETED):
            self.not_in_file.append(f"{uid}: prepared, record in the file {record}")
        elif not prepared and record is not None:
            self.not_in_file.append(f"{uid}: unprepared, record still in the file")

    def release_oldest(self) -> None:
        uid = self.held[0]
        self.check(uid)
        while self.call("unprepare", uid) != "":
            if self.stop.is_set():
                return
        self.check_file(uid, prepared=False)
        self.held.popleft()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            uid = f"c{self.index}-{n}"
            n += 1
            gpu = GPUS[n % len(GPUS)]
            self.node.fetcher.add(claim(uid, [result(gpu, share_id=f"s-{uid}")]))
            while not self.stop.is_set():
                error = self.call("prepare", uid)
                if error == "":
                    self.check_file(uid, prepared=True)
                    self.acknowledged += 1
                    self.held.append(uid)
                    break
                if error is not None:
                    self.errors.append(f"{uid}: {error}")
            if len(self.held) > KEEP:
                self.release_oldest()
        for ch in self.channels.values():
            ch.close()


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    # Unix socket paths are limited to 107 bytes; pytest's tmp paths can get long.
    n = Node(Path(tmp_path_factory.mktemp("ru", numbered=True)))
    yield n
    for plugin in n.plugins.values():
        plugin.stop()


def test_overlapping_starts_lose_no_acknowledged_prepare(node: Node) -> None:
    with node.live_lock:
        node.live.append(node.start_instance(0))
    stop = threading.Event()
    clients = [Client(node, i, stop) for i in range(CLIENTS)]
    for c in clients:
        c.start()
    started = time.monotonic()
    for n in range(1, STARTS + 1):
        new = node.start_instance(n)  # recovery runs here while the old one serves
        with node.live_lock:
            node.live.append(new)
        time.sleep(OVERLAP_S)
        with node.live_lock:
            old = node.live.pop(0)
        node.stop_instance(old)
    stop.set()
    for c in clients:
        c.join(TIMEOUT_S)
        assert not c.is_alive()
    for c in clients:
        for uid in c.held:
            c.check(uid)
    acknowledged = sum(c.acknowledged for c in clients)
    lost = [x for c in clients for x in c.lost]
    errors = [x for c in clients for x in c.errors]
    not_in_file = [x for c in clients for x in c.not_in_file]
    print(
        f"\nrolling update: {STARTS} overlapping starts, {acknowledged} prepares acknowledged, "
        f"{len(lost)} lost, {len(not_in_file)} not in the file when answered, {len(errors)} "
        f"failed, {time.monotonic() - started:.1f} s"
    )
    assert errors == [], f"{len(errors)} prepares failed, e.g. {errors[:3]}"
    assert acknowledged >= STARTS, "the clients hardly got any prepare through"
    assert lost == [], f"{len(lost)} acknowledged prepares lost, e.g. {lost[:3]}"
    assert not_in_file == [], f"{len(not_in_file)} answers not in the file, e.g. {not_in_file[:3]}"


# --- the busy old instance and the new one's bounded start (issue 41) ---------------------------


def prepare(stub: dra_v1_pb2_grpc.DRAPluginStub, uid: str, timeout_s: float) -> str:
    """The claim's error, "" on success."""
    reply = stub.NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(uid)]), timeout=timeout_s
    )
    entry = reply.claims[uid]
    return entry.error or ("" if entry.devices else "no devices")


def unprepare(stub: dra_v1_pb2_grpc.DRAPluginStub, uid: str, timeout_s: float) -> str:
    reply = stub.NodeUnprepareResources(
        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim_msg(uid)]), timeout=timeout_s
    )
    return str(reply.claims[uid].error)


def on_disk(root: Path, uid: str, *, prepared: bool) -> str | None:
    """What is wrong with the claim's files right after an answer said it is (un)prepared:
    its record in ``checkpoint.json`` (read without the lock, as an operator reads it) and its
    CDI spec; None when both agree with the answer."""
    record = Checkpoint.model_validate_json(
        (root / "state" / "checkpoint.json").read_bytes()
    ).claims.get(uid)
    spec = cdi.spec_path(root / "cdi", ClaimUID(uid)).exists()
    if prepared and (record is None or record.state != PREPARE_COMPLETED or not spec):
        return f"{uid}: prepared, record {record}, spec {'present' if spec else 'missing'}"
    if not prepared and (record is not None or spec):
        return f"{uid}: unprepared, record {record}, spec {'present' if spec else 'gone'}"
    return None


class LoopClient(threading.Thread):
    """Prepares a claim on one instance, checks its files, unprepares it, checks again; then
    the next claim, without a pause (only while ``go`` is set)."""

    def __init__(
        self, node: Node, index: int, socket: Path, stop: threading.Event, go: threading.Event
    ) -> None:
        super().__init__(name=f"loop-client-{index}", daemon=True)
        self.node, self.index, self.socket, self.stop, self.go = node, index, socket, stop, go
        self.acknowledged = 0
        self.lost: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with grpc.insecure_channel(f"unix:{self.socket}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            n = 0
            while not self.stop.is_set():
                if not self.go.wait(TIMEOUT_S):
                    continue
                uid = f"c{self.index}-{n}"
                n += 1
                gpu = GPUS[n % len(GPUS)]
                self.node.fetcher.add(claim(uid, [result(gpu, share_id=f"s-{uid}")]))
                try:
                    self.once(stub, uid)
                except grpc.RpcError as exc:
                    self.errors.append(f"{uid}: {exc}")

    def once(self, stub: dra_v1_pb2_grpc.DRAPluginStub, uid: str) -> None:
        # Bounded like the kubelet's calls; the node lock's own bound is longer, so a call that
        # waited that long fails here (an error), not as an answer.
        if error := prepare(stub, uid, STUCK_S):
            self.errors.append(f"{uid}: {error}")
            return
        self.acknowledged += 1
        if wrong := on_disk(self.node.root, uid, prepared=True):
            self.lost.append(wrong)
        if error := unprepare(stub, uid, STUCK_S):
            self.errors.append(f"{uid}: unprepare: {error}")
            return
        if wrong := on_disk(self.node.root, uid, prepared=False):
            self.lost.append(wrong)


class Start(threading.Thread):
    """Starts instance ``n`` (its recovery under the node lock, then serving), prepares one
    claim through its socket, checks, unprepares it: a start serves once that prepare answered."""

    def __init__(self, node: Node, n: int) -> None:
        super().__init__(name=f"start-{n}", daemon=True)
        self.node, self.n = node, n
        self.began = time.monotonic()
        self.answered = threading.Event()
        self.served_after = 0.0
        self.settings: plugin_settings.Settings | None = None
        self.problems: list[str] = []
        self.start()

    def run(self) -> None:
        try:
            self.serve()
        except Exception as exc:  # the start failed (the old lock: recovery's 120 s ran out)
            self.problems.append(f"start {self.n}: {exc!r}")
        finally:
            if not self.answered.is_set():
                self.served_after = time.monotonic() - self.began
                self.answered.set()

    def serve(self) -> None:
        self.settings = self.node.start_instance(self.n)
        uid = f"new-{self.n}"
        self.node.fetcher.add(claim(uid, [result(GPUS[self.n % len(GPUS)], share_id=uid)]))
        dra = plugin_settings.socket_paths(self.settings).dra
        with grpc.insecure_channel(f"unix:{dra}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            error = prepare(stub, uid, STUCK_S)
            self.served_after = time.monotonic() - self.began
            self.answered.set()
            if error:
                self.problems.append(f"{uid}: {error}")
                return
            if wrong := on_disk(self.node.root, uid, prepared=True):
                self.problems.append(f"lost: {wrong}")
            if error := unprepare(stub, uid, STUCK_S):
                self.problems.append(f"{uid}: unprepare: {error}")
            elif wrong := on_disk(self.node.root, uid, prepared=False):
                self.problems.append(f"lost: {wrong}")


def test_a_new_instance_serves_within_its_bound_while_the_old_one_is_busy(node: Node) -> None:
    old = node.start_instance(0)
    old_lock = node.call_locks[str(old.pod_uid)]
    stop, go = threading.Event(), threading.Event()
    go.set()
    dra = plugin_settings.socket_paths(old).dra
    clients = [LoopClient(node, i, dra, stop, go) for i in range(LOOP_CLIENTS)]
    for c in clients:
        c.start()
    began = time.monotonic()
    while sum(c.acknowledged for c in clients) < LOOP_CLIENTS and time.monotonic() - began < 30:
        time.sleep(0.01)  # under way
    times: list[float] = []
    missed: list[int] = []
    problems: list[str] = []
    try:
        for n in range(1, STARTS + 1):
            start = Start(node, n)
            if not start.answered.wait(SERVE_WITHIN_S):
                missed.append(n)
            start.join(SERVE_WITHIN_S)  # and its unprepare
            if start.is_alive():
                # Stuck behind the busy instance (the old lock): pause that one, so that the
                # start gets through and the next one begins on a level field.
                if n not in missed:
                    problems.append(f"start {n}: its unprepare took over {SERVE_WITHIN_S:g} s")
                go.clear()
                start.join(STUCK_S)
                go.set()
            assert not start.is_alive(), f"start {n} hung even without load"
            times.append(start.served_after)
            problems += start.problems
            if start.settings is not None:
                node.stop_instance(start.settings)
    finally:
        stop.set()
        go.set()
        for c in clients:
            c.join(STUCK_S)
    acknowledged = sum(c.acknowledged for c in clients)
    lost = [x for c in clients for x in c.lost]
    errors = [x for c in clients for x in c.errors]
    print(
        f"\nbusy old instance: {STARTS} starts, served after {max(times):.2f} s at most, "
        f"{statistics.median(times):.2f} s median, {len(missed)} missed {SERVE_WITHIN_S:g} s "
        f"{missed[:10]}; {acknowledged} prepares acknowledged on the old instance, {len(lost)} "
        f"lost, {len(errors)} failed; the old instance's turns {getattr(old_lock, 'turns', '?')}, "
        f"cut short for the other {getattr(old_lock, 'yielded', '?')}; "
        f"{time.monotonic() - began:.1f} s"
    )
    assert all(not c.is_alive() for c in clients)
    assert missed == [], f"{len(missed)} of {STARTS} starts did not serve within {SERVE_WITHIN_S} s"
    assert problems == [], f"{len(problems)} problems with the new instances, e.g. {problems[:3]}"
    assert errors == [], f"{len(errors)} calls failed, e.g. {errors[:3]}"
    assert lost == [], f"{len(lost)} acknowledged prepares lost, e.g. {lost[:3]}"
    assert acknowledged >= STARTS, "the clients hardly got any prepare through"
    # The new instances really waited for the busy one (it held the lock when they came).
    assert old_lock.yielded >= STARTS // 2, "the new instances hardly ever had to wait"
