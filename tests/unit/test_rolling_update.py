"""Rolling update: two plugin instances overlap on one node while prepares keep coming.

Each round starts a new instance (with its start-up recovery) while the previous one is still
serving prepare and unprepare calls, then stops the previous one, as a DaemonSet rolling update
with ``maxSurge`` does. Both are real ``NodePlugin`` instances in rolling-update mode (real unix
sockets, the real node-wide call lock, the real prepare transaction) sharing the CDI and state
directories; the API server is a fake. Client threads prepare claims through whichever
instances serve, keep each acknowledged claim a while, check that its CDI spec and completed
record are still there, then unprepare it.

Cases, over ``DRA_GPU_ROLLING_STARTS`` starts (40 by default; set it higher for a longer run,
e.g. ``DRA_GPU_ROLLING_STARTS=400 .venv/bin/pytest -s tests/unit/test_rolling_update.py``):
- no acknowledged prepare loses its spec or record;
- ``checkpoint.json``, read as an operator reads it (no lock) right after each answer, has the
  completed record of each acknowledged prepare and none of each acknowledged unprepare.
The figures (starts, prepares acknowledged, lost, not in the file when answered) are printed;
``-s`` shows them.
"""

from __future__ import annotations

import os
import random
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
        self.live_lock = threading.Lock()

    def start_instance(self, n: int) -> plugin_settings.Settings:
        settings = make_settings(self.root, "--pod-uid", f"uid-{n}")
        state = device_state(
            self.root,
            devices=INVENTORY,
            claims=self.fetcher,
            boot_id=lambda: "boot",
            call_lock=call_lock.NodeCallLock(plugin_settings.socket_paths(settings).lock),
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
