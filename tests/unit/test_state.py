"""The prepare/unprepare transaction over a simulated node, a fake API and temp directories.

Cases:
- prepare returns per device its request names, pool, device, CDI IDs and share ID, writes a
  valid CDI spec and a completed checkpoint record; a second prepare gives the same answer
  without asking the API again; unprepare removes spec and record; both are idempotent;
- claims in one call are independent; each bad input is that claim's error only;
- a device prepared for one claim is refused to another unless both allocations share it;
- start after a restart: interrupted prepares rolled back, missing specs rebuilt, every spec
  rebuilt after a reboot (new boot ID), a spec without a record adopted (record rebuilt from
  it; one that cannot be read back reported and kept), a corrupt checkpoint reported and moved
  aside while specs are kept;
- a crash at each fault step (the on-disk state at that moment, restarted): the repeated call
  succeeds, no spec leaks or is duplicated, the checkpoint is valid;
- many claims prepared in parallel all succeed;
- a prepare SIGKILLed between writing a temp file and renaming it: the next start removes the
  temp file (checkpoint or CDI spec) and the repeated prepare succeeds;
- a corrupt checkpoint, then another restart: every prepared claim keeps its spec, gets its
  record back from the spec, still holds its devices against other claims, answers a repeated
  prepare in full and unprepares; claims sharing a device both prepare again;
- start with the state disk full (a small tmpfs; needs root): the plugin starts and says why it
  cannot write, prepared claims are answered, new prepares fail naming the error, and all works
  again once there is space;
- with a call lock (rolling update), prepare reads its claim while another holder has the lock
  and writes nothing until it gets it; unprepare waits for it too; a claim completed when it was
  read but unprepared by the other holder since is read again under the lock;
- a prepare reads its claim while a checkpoint commit holds the checkpoint lock;
- a lock file (the call lock, the checkpoint's) held by another process past the bounded wait
  fails the call's claims with a message naming the file and the holder's PID, and the plugin
  goes on: once it is released the retry succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_claims import (
    NODE,
    FakeFetcher,
    claim,
    config,
    device_state,
    gpu_config,
    inventory,
    mig_config,
    ref,
    result,
)
from lock_holder import held_by_another_process

from dra_gpu.kubeletplugin import atomicfile, call_lock
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import cdi
from dra_gpu.prepare.cdi_validate import validate_spec
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, CheckpointStore
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.sharing.runner import RecordingRunner, recorded
from dra_gpu.prepare.state import FAULT_STEPS, SIDE_EFFECT_FAULT_STEPS, DeviceState
from e2e import waiting

INVENTORY = inventory()
MIG = "gpu-1-mig-1g5gb-19-2"


class Env:
    """Directories, a fake API and a boot ID shared by the DeviceStates of one test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetcher = FakeFetcher()
        self.boot = "boot-1"
        self.reports: list[tuple[str, str]] = []

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def state(self, **kwargs: Any) -> DeviceState:
        return device_state(
            self.root,
            devices=INVENTORY,
            claims=self.fetcher,
            boot_id=lambda: self.boot,
            report=lambda reason, msg: self.reports.append((reason, msg)),
            **kwargs,
        )

    def specs(self) -> set[str]:
        return set(cdi.list_specs(self.cdi_root))

    def checkpoint_claims(self) -> dict[str, str]:
        cp = CheckpointStore(self.state_dir).load()
        return {uid: rec.state for uid, rec in cp.claims.items()}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield Env(tmp_path)


def test_prepare_answer_spec_and_record(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0", "train"), result(MIG, "infer", share_id="s9")]))
    state = env.state()
    out = state.prepare([ref("u1")])
    assert out[ClaimUID("u1")].error == ""
    devices = out[ClaimUID("u1")].devices
    assert [(d.request_names, d.pool_name, d.device_name, d.share_id) for d in devices] == [
        (("train",), NODE, "gpu-0", None),
        (("infer",), NODE, MIG, "s9"),
    ]
    assert devices[0].cdi_device_ids == ("k8s.gpu.nvidia.com/claim=u1-gpu-0",)
    spec = json.loads(cdi.spec_path(env.cdi_root, ClaimUID("u1")).read_text())
    assert validate_spec(spec) == []
    assert "GPU_DEVICE_1_MIG_1G5GB_19_2=" + MIG in spec["devices"][1]["containerEdits"]["env"]
    assert env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}

    assert state.prepare([ref("u1")]) == out, "prepare twice gives the same answer"
    assert env.fetcher.calls == 1, "a completed claim is answered from the checkpoint"
    cdi.spec_path(env.cdi_root, ClaimUID("u1")).unlink()
    assert state.prepare([ref("u1")]) == out
    assert json.loads(cdi.spec_path(env.cdi_root, ClaimUID("u1")).read_text()) == spec, (
        "a repeated prepare puts back a spec that went missing"
    )

    assert state.unprepare([ref("u1")]) == {"u1": ""}
    assert env.specs() == set() and env.checkpoint_claims() == {}
    assert state.unprepare([ref("u1")]) == {"u1": ""}, "unprepare twice succeeds"
    assert state.unprepare([ref("never")]) == {"never": ""}, "unknown claim is success"


def test_sharing_settings_reach_the_container_env(env: Env) -> None:
    mps = gpu_config(
        sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}}
    )
    env.fetcher.add(claim("u1", [result("gpu-0")], configs=[config(mps)]))
    env.state().prepare([ref("u1")])
    env_vars = json.loads(cdi.spec_path(env.cdi_root, ClaimUID("u1")).read_text())["devices"][0][
        "containerEdits"
    ]["env"]
    assert "GPU_DEVICE_0_SHARING_STRATEGY=MPS" in env_vars
    assert "GPU_DEVICE_0_MPS_ACTIVE_THREAD_PERCENTAGE=10" in env_vars


BAD_CLAIMS = [
    pytest.param(None, "claim default/claim-bad not found", id="unknown-claim"),
    pytest.param(
        claim("other-uid", [result("gpu-0")], name="claim-bad"), "has UID other-uid", id="uid"
    ),
    pytest.param(claim("bad", None), "is not allocated", id="unallocated"),
    pytest.param(
        claim("bad", [result("gpu-0", pool="node-z")]), "allocation for another node", id="node"
    ),
    pytest.param(
        claim("bad", [result("x", driver="other.io")]), "no devices of driver", id="driver"
    ),
    pytest.param(
        claim("bad", [result("gpu-0")], configs=[config(gpu_config(bogus=1))]),
        "bogus: unknown field",
        id="config-unknown-field",
    ),
    pytest.param(
        claim("bad", [result("gpu-0")], configs=[config(gpu_config(sharing={"strategy": "Z"}))]),
        "sharing.strategy: must be one of",
        id="unknown-strategy",
    ),
    pytest.param(
        claim(
            "bad",
            [result("gpu-0")],
            configs=[config(gpu_config(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}))],
        ),
        "sharing.mpsConfig: must not be set when strategy is TimeSlicing",
        id="both-subconfigs",
    ),
    pytest.param(
        claim(
            "bad",
            [result("gpu-0")],
            configs=[
                config(
                    {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"},
                    requests=["gpu"],
                )
            ],
        ),
        "a MigDeviceConfig cannot configure gpu-0, which is a full GPU",
        id="mig-config-on-gpu",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD_CLAIMS)
def test_bad_claim_fails_alone(env: Env, body: dict[str, Any] | None, message: str) -> None:
    env.fetcher.add(claim("good", [result("gpu-0")]))
    if body is not None:
        body["metadata"]["name"] = "claim-bad"
        env.fetcher.add(body)
    out = env.state().prepare([ref("bad"), ref("good")])
    assert message in out[ClaimUID("bad")].error
    assert out[ClaimUID("bad")].devices == ()
    assert out[ClaimUID("good")].error == ""
    assert env.specs() == {"good"} and env.checkpoint_claims() == {"good": PREPARE_COMPLETED}


def test_device_of_another_claim_is_refused_unless_shared(env: Env) -> None:
    env.fetcher.add(claim("a", [result("gpu-0")]))
    env.fetcher.add(claim("b", [result("gpu-0")]))
    state = env.state()
    assert state.prepare([ref("a")])[ClaimUID("a")].error == ""
    error = state.prepare([ref("b")])[ClaimUID("b")].error
    assert "device gpu-0 is already prepared for claim default/claim-a (a) and is not shared" in (
        error
    )
    assert env.specs() == {"a"}
    state.unprepare([ref("a")])
    env.fetcher.add(claim("a", [result("gpu-0", share_id="s1")]))
    env.fetcher.add(claim("b", [result("gpu-0", share_id="s2")]))
    out = state.prepare([ref("a"), ref("b")])
    assert [out[ClaimUID(u)].error for u in ("a", "b")] == ["", ""]


def test_an_admin_access_claim_shares_a_held_device_and_leaves_the_holder_alone(
    env: Env,
) -> None:
    """``dra-gpu validate``'s check claim (admin access) on a GPU a workload holds with a
    time-slice interval: prepared next to it in either order; its unprepare leaves the
    workload's record, spec and interval; after a lost checkpoint both prepare again."""
    long = gpu_config(
        sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    )
    env.fetcher.add(claim("user", [result("gpu-0")], configs=[config(long)]))
    env.fetcher.add(claim("admin", [result("gpu-0", admin=True)]))
    commands = env.state_dir / "commands.jsonl"
    state = env.state(sharing=time_slicing(env))
    for order in (["user", "admin"], ["admin", "user"]):
        for uid in order:
            assert state.prepare([ref(uid)])[ClaimUID(uid)].error == "", (order, uid)
        assert env.specs() == {"user", "admin"}
        before = recorded(commands)
        assert state.unprepare([ref("admin")]) == {"admin": ""}
        assert env.specs() == {"user"}
        assert env.checkpoint_claims() == {"user": PREPARE_COMPLETED}
        assert recorded(commands) == before, "the workload's GPU keeps its interval"
        assert state.unprepare([ref("user")]) == {"user": ""}
        assert recorded(commands)[-1].argv[-1] == "0", "the last holder gone: back to Default"

    answers = state.prepare([ref("user"), ref("admin")])
    (env.state_dir / "checkpoint.json").write_text("{not json")
    again = env.state(sharing=time_slicing(env))
    again.start()
    assert again.prepare([ref("user"), ref("admin")]) == answers


def time_slicing(env: Env) -> Sharing:
    """Time-slicing switched on, its nvidia-smi commands recorded in the state directory."""
    return Sharing(
        runner=RecordingRunner(env.state_dir / "commands.jsonl"),
        state_dir=env.state_dir,
        switches=Switches(time_slicing=True),
    )


def interrupted(env: Env, uid: str) -> None:
    """Leave what a crash leaves of a prepare that changes a GPU (time-slicing switched on): a
    ``PrepareStarted`` record, the setting applied, no spec."""
    with pytest.raises(_Crash):
        env.state(sharing=time_slicing(env), fault=_raise_at("after-sharing-applied")).prepare(
            [ref(uid)]
        )
    assert env.checkpoint_claims()[uid] == PREPARE_STARTED
    assert uid not in env.specs()


def test_start_recovers_after_restart_and_reboot(env: Env) -> None:
    for uid in ("done", "lost-spec", "started"):
        env.fetcher.add(
            claim(
                uid, [result({"done": "gpu-0", "lost-spec": MIG}.get(uid, "gpu-3-mig-3g20gb-9-0"))]
            )
        )
    state = env.state()
    state.prepare([ref("done"), ref("lost-spec")])
    interrupted(env, "started")
    cdi.spec_path(env.cdi_root, ClaimUID("lost-spec")).unlink()
    # A prepared claim whose record the checkpoint lost.
    env.fetcher.add(claim("no-record", [result("gpu-2-mig-2g10gb-14-4")]))
    assert state.prepare([ref("no-record")])[ClaimUID("no-record")].error == ""
    state.store.update(lambda cp: cp.without_claim("no-record"), durable=True)

    report = env.state().start()
    assert report.rolled_back == ("started",)
    assert report.rewritten == ("lost-spec",)
    assert report.adopted == ("no-record",), env.reports
    assert env.specs() == {"done", "lost-spec", "no-record"}
    assert env.checkpoint_claims() == {
        "done": PREPARE_COMPLETED,
        "lost-spec": PREPARE_COMPLETED,
        "no-record": PREPARE_COMPLETED,
    }

    shutil.rmtree(env.cdi_root)  # a reboot empties /var/run/cdi
    env.boot = "boot-2"
    report = env.state().start()
    assert sorted(report.rewritten) == ["done", "lost-spec"], (
        "a record rebuilt from a spec lacks the config; the kubelet's next prepare brings it back"
    )
    for uid in ("done", "lost-spec"):
        assert (
            validate_spec(json.loads(cdi.spec_path(env.cdi_root, ClaimUID(uid)).read_text())) == []
        )
    assert env.state().start().rewritten == (), "same boot, specs present: nothing to do"


def test_corrupt_checkpoint_then_restart_keeps_every_prepared_claim(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0", "train")]))
    sharing = mig_config(sharing={"strategy": "TimeSlicing"})
    env.fetcher.add(claim("u2", [result(MIG, "infer")], configs=[config(sharing)]))
    state = env.state()
    answers = state.prepare([ref("u1"), ref("u2")])
    specs = {u: cdi.spec_path(env.cdi_root, ClaimUID(u)).read_text() for u in ("u1", "u2")}
    (env.state_dir / "checkpoint.json").write_text("{not json")  # the specs are all that is left

    first = env.state().start()
    second = env.state().start()  # the next clean start must not take them for orphans
    assert {u: cdi.spec_path(env.cdi_root, ClaimUID(u)).read_text() for u in specs} == specs
    assert first.corrupt is not None and "rebuilt 2" in first.corrupt
    assert second.corrupt is None
    assert env.checkpoint_claims() == {"u1": PREPARE_COMPLETED, "u2": PREPARE_COMPLETED}
    restarted = env.state()
    assert restarted.prepared_devices() == {"gpu-0", MIG}

    env.fetcher.add(claim("u3", [result("gpu-0")]))
    error = restarted.prepare([ref("u3")])[ClaimUID("u3")].error
    assert "device gpu-0 is already prepared for claim default/claim-u1 (u1)" in error
    assert env.specs() == {"u1", "u2"}

    assert restarted.prepare([ref("u1"), ref("u2")]) == answers, (
        "a repeated prepare of a claim whose record was rebuilt gets the full answer"
    )
    assert {u: cdi.spec_path(env.cdi_root, ClaimUID(u)).read_text() for u in specs} == specs
    records = CheckpointStore(env.state_dir).load().claims
    assert not records["u1"].from_spec and not records["u2"].from_spec
    assert restarted.unprepare([ref("u1"), ref("u2")]) == {"u1": "", "u2": ""}
    assert env.specs() == set() and env.checkpoint_claims() == {}


def test_a_spec_that_cannot_be_read_back_is_reported_and_kept(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    env.state().prepare([ref("u1")])
    stray = cdi.spec_path(env.cdi_root, ClaimUID("stray"))
    stray.write_text(cdi.spec_path(env.cdi_root, ClaimUID("u1")).read_text())  # names u1's devices
    report = env.state().start()
    assert report.adopted == () and stray.exists()
    [(reason, message)] = env.reports
    assert reason == "CDISpecUnreadable" and "is not a device of claim stray" in message
    assert env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}


def test_claims_sharing_a_device_both_prepare_again_after_a_corrupt_checkpoint(env: Env) -> None:
    env.fetcher.add(claim("a", [result("gpu-0", share_id="s1")]))
    env.fetcher.add(claim("b", [result("gpu-0", share_id="s2")]))
    answers = env.state().prepare([ref("a"), ref("b")])
    (env.state_dir / "checkpoint.json").write_text("{not json")
    env.state().start()
    assert env.state().prepare([ref("a"), ref("b")]) == answers


def test_corrupt_checkpoint_is_reported_and_serving_continues(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    env.fetcher.add(claim("u2", [result("gpu-1-mig-2g10gb-14-0")]))
    env.state().prepare([ref("u1")])
    (env.state_dir / "checkpoint.json").write_text("{not json")
    report = env.state().start()
    assert report.corrupt is not None and "moved aside to" in report.corrupt
    assert [r for r, _ in env.reports] == ["CheckpointCorrupt"]
    assert len(list(env.state_dir.glob("checkpoint.json.corrupt-*"))) == 1
    assert env.specs() == {"u1"}, "specs of unknown claims are kept after corruption"
    assert env.state().prepare([ref("u2")])[ClaimUID("u2")].error == ""


class _Crash(BaseException):
    """Stops the transaction like SIGKILL: no except clause of the plugin catches it."""


def _raise_at(target: str) -> Callable[[str], None]:
    def fault(step: str) -> None:
        if step == target:
            raise _Crash(step)

    return fault


def _snapshot_at(target: str, src: Path, dst: Path) -> Callable[[str], None]:
    """Copy the on-disk state as it is at ``target``, then stop like a kill would (every write
    before the step is done when the step is reached: no thread writes on behind it)."""

    def fault(step: str) -> None:
        if step == target:
            shutil.copytree(src, dst)
            raise _Crash(step)

    return fault


@pytest.mark.parametrize(
    ("step", "sharing"),
    [(step, False) for step in FAULT_STEPS]
    + [(step, True) for step in (*SIDE_EFFECT_FAULT_STEPS, *FAULT_STEPS)],
)
def test_crash_at_each_step_then_restart(tmp_path: Path, step: str, sharing: bool) -> None:
    """``sharing``: time-slicing switched on, so prepare records PrepareStarted first."""
    live, frozen = Env(tmp_path / "live"), Env(tmp_path / "frozen")
    for e in (live, frozen):
        e.fetcher.add(claim("u1", [result("gpu-0"), result(MIG, "mig")]))
    (live.root).mkdir()

    def state(env: Env, **kwargs: Any) -> DeviceState:
        return env.state(sharing=time_slicing(env), **kwargs) if sharing else env.state(**kwargs)

    unprepare = step.startswith("unprepare")
    if unprepare:
        state(live).prepare([ref("u1")])
    crashing = state(live, fault=_snapshot_at(step, live.root, frozen.root))
    with pytest.raises(_Crash):
        (crashing.unprepare if unprepare else crashing.prepare)([ref("u1")])

    restarted = state(frozen)  # the process that comes back sees exactly the frozen disk
    restarted.start()
    if unprepare:
        assert restarted.unprepare([ref("u1")]) == {"u1": ""}
        assert frozen.specs() == set() and frozen.checkpoint_claims() == {}
    else:
        out = restarted.prepare([ref("u1")])[ClaimUID("u1")]
        assert out.error == "" and len(out.devices) == 2
        assert frozen.specs() == {"u1"}
        assert frozen.checkpoint_claims() == {"u1": PREPARE_COMPLETED}
    assert [p.name for p in frozen.cdi_root.iterdir() if not p.name.endswith(".json")] == []


def test_parallel_claims_all_prepare(env: Env) -> None:
    names = [n for n in INVENTORY]
    for i, name in enumerate(names):
        env.fetcher.add(claim(f"u{i}", [result(name)]))
    state = env.state()
    results: dict[str, str] = {}

    def work(i: int) -> None:
        out = state.prepare([ref(f"u{i}")])
        results[f"u{i}"] = out[ClaimUID(f"u{i}")].error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {f"u{i}": "" for i in range(len(names))}
    assert len(env.specs()) == len(names)
    state.close()


def prepare_reads_then_waits(
    env: Env, state: DeviceState, held: contextlib.AbstractContextManager[object]
) -> None:
    """Prepares claim u1 while ``held`` is held: the claim is read, nothing is written until
    ``held`` is released, then the prepare succeeds."""
    done: list[str] = []
    with held:
        worker = threading.Thread(
            target=lambda: done.append(state.prepare([ref("u1")])[ClaimUID("u1")].error)
        )
        worker.start()
        waiting.wait_for("the claim GET", lambda: env.fetcher.calls == 1, timeout=10)
        worker.join(0.3)
        assert done == [] and env.specs() == set(), "nothing is written without the lock"
    worker.join(10)
    assert done == [""] and env.specs() == {"u1"}


def test_call_lock_is_taken_after_the_claim_is_read(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    lock = env.root / "calls.lock"
    state = env.state(call_lock=lambda: call_lock.held(lock))
    # The other instance of a rolling update, mid-call.
    prepare_reads_then_waits(env, state, call_lock.held(lock))
    with call_lock.held(lock):
        worker = threading.Thread(target=lambda: state.unprepare([ref("u1")]))
        worker.start()
        worker.join(0.3)
        assert env.specs() == {"u1"}, "unprepare waits for the lock"
    worker.join(10)
    assert env.specs() == set()


def test_claim_unprepared_by_the_other_instance_after_the_read_is_read_again(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    lock = env.root / "calls.lock"
    asked = threading.Event()

    @contextlib.contextmanager
    def held_after_asking() -> Iterator[None]:
        asked.set()
        with call_lock.held(lock):
            yield

    ours, theirs = env.state(call_lock=held_after_asking), env.state()
    assert ours.prepare([ref("u1")])[ClaimUID("u1")].error == ""
    calls = env.fetcher.calls
    asked.clear()
    with call_lock.held(lock):
        worker = threading.Thread(target=lambda: ours.prepare([ref("u1")]))
        worker.start()
        assert asked.wait(10)  # read (completed: no GET), now waiting for the lock
        assert env.fetcher.calls == calls
        assert theirs.unprepare([ref("u1")]) == {"u1": ""}
    worker.join(10)
    assert env.fetcher.calls == calls + 1, "the claim is read under the lock"
    assert env.specs() == {"u1"} and env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}


def test_prepared_devices_are_those_of_prepared_claims(env: Env) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0"), result(MIG, "infer")]))
    state = env.state()
    assert state.prepared_devices() == set()
    state.prepare([ref("u1")])
    assert state.prepared_devices() == {"gpu-0", MIG}
    state.unprepare([ref("u1")])
    assert state.prepared_devices() == set()


# Runs a prepare in a child process that SIGKILLs itself at its Nth atomic rename, i.e. with that
# file's temp copy written and not yet renamed: the checkpoint's (the first: the record) or the
# spec's (the second, after the record is on disk).
_KILLED_MID_WRITE = """
import os, signal, sys
from pathlib import Path
from fake_claims import FakeFetcher, claim, device_state, inventory, result
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare.plan import ClaimRef

root, kill_at = Path(sys.argv[1]), int(sys.argv[2])
renames, real_replace = [], os.replace
def replace(src, dst):
    renames.append(dst)
    if len(renames) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
os.replace = replace
fetcher = FakeFetcher(claim("u1", [result("gpu-0")]))
state = device_state(root, devices=inventory(), claims=fetcher, boot_id=lambda: "boot-1")
state.prepare([ClaimRef(uid=ClaimUID("u1"), namespace="default", name="claim-u1")])
"""


@pytest.mark.parametrize("kill_at", [1, 2], ids=["first-rename", "second-rename"])
def test_sigkill_mid_write_leaves_a_temp_file_the_next_start_removes(
    env: Env, kill_at: int
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_WRITE, str(env.root), str(kill_at)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr

    def temp_files() -> list[str]:  # the device metadata files are in folders of their own
        return sorted(p.name for d in (env.state_dir, env.cdi_root) for p in d.rglob("*"))

    left = [n for n in temp_files() if ".tmp-" in n]
    assert len(left) == 1, f"the kill left no temp file: {temp_files()}"
    report = env.state().start()
    assert [n for n in temp_files() if ".tmp-" in n] == []
    assert report.temp_files_removed == 1
    if kill_at == 1:
        # The record never reached the file (nor was the kubelet answered): nothing prepared.
        assert env.specs() == set() and env.checkpoint_claims() == {}
    else:
        # The record was on disk before the spec's write: start puts the spec in place.
        assert env.specs() == {"u1"} and env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    assert env.state().prepare([ref("u1")])[ClaimUID("u1")].error == ""
    assert env.specs() == {"u1"} and env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}


@pytest.fixture
def small_state_disk(env: Env) -> Iterator[Path]:
    """A 512 KiB tmpfs as the state directory. Runs or fails: a mount refused (no root, or no
    CAP_SYS_ADMIN) fails the test with the reason, never skips it."""
    env.state_dir.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(env.state_dir)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(
            f"mounting a small tmpfs as a full disk was refused (euid {os.geteuid()}; it needs "
            f"root): {done.stderr.strip()}"
        )
    try:
        yield env.state_dir
    finally:
        subprocess.run(["umount", "-l", str(env.state_dir)], check=True)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler file."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    return filler


def test_start_on_a_full_state_disk_serves(env: Env, small_state_disk: Path) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    env.fetcher.add(claim("u2", [result(MIG, "mig")]))
    env.fetcher.add(claim("u3", [result("gpu-1-mig-2g10gb-14-0")]))
    answer = env.state().prepare([ref("u1")])
    interrupted(env, "u2")  # something for start to settle
    filler = _fill(small_state_disk)

    report = env.state().start()
    assert report.rolled_back == ("u2",)
    assert [p for p in report.problems if "No space left on device" in p], report.problems
    assert [r for r, _ in env.reports] == ["CheckpointWriteFailed"]
    state = env.state()
    assert state.prepare([ref("u1")]) == answer, "a prepared claim is answered"
    error = state.prepare([ref("u3")])[ClaimUID("u3")].error
    assert "No space left on device" in error

    filler.unlink()
    assert state.prepare([ref("u3")])[ClaimUID("u3")].error == ""
    assert state.prepare([ref("u2")])[ClaimUID("u2")].error == "", "the retry of u2 succeeds"
    assert env.state().start().problems == ()
    assert env.checkpoint_claims() == {u: PREPARE_COMPLETED for u in ("u1", "u2", "u3")}


def test_claim_is_read_while_a_checkpoint_commit_is_in_progress(env: Env) -> None:
    """A burst of prepares reads its claims while another call's checkpoint write (and fsyncs)
    holds the checkpoint lock; only the write of its own record waits for it."""
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    state = env.state()
    state.start()
    # A commit in progress.
    lock = env.state_dir / "checkpoint.lock"
    prepare_reads_then_waits(env, state, atomicfile.locked(lock, timeout_s=10))
    assert env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}


def test_a_plain_claim_costs_one_checkpoint_write_each_way(env: Env) -> None:
    """What /metrics shows as checkpoint writes: a claim that changes nothing outside the plugin's
    files is recorded once on prepare and once on unprepare, both fsynced."""
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    state = env.state()
    state.prepare([ref("u1")])
    assert state.store.writes == (1, 1)
    state.unprepare([ref("u1")])
    assert state.store.writes == (2, 2)

    shared = env.state(sharing=time_slicing(env))
    shared.prepare([ref("u1")])
    assert shared.store.writes == (2, 1), "with sharing on, PrepareStarted is recorded first"


@pytest.mark.parametrize("which", ["call lock", "checkpoint lock"])
def test_a_lock_held_too_long_fails_the_calls_claims_naming_its_holder(
    env: Env, which: str
) -> None:
    env.fetcher.add(claim("u1", [result("gpu-0")]))
    env.fetcher.add(claim("u2", [result(MIG)]))
    calls = env.root / "calls.lock"
    state = env.state(
        call_lock=call_lock.NodeCallLock(calls, timeout_s=0.2),
        store=CheckpointStore(env.state_dir, lock_timeout_s=0.2),
    )
    assert state.prepare([ref("u2")])[ClaimUID("u2")].error == ""
    lock = calls if which == "call lock" else env.state_dir / "checkpoint.lock"
    with held_by_another_process(lock) as pid:
        prepared = state.prepare([ref("u1")])[ClaimUID("u1")]
        unprepared = state.unprepare([ref("u2")])[ClaimUID("u2")]
    for error in (prepared.error, unprepared):
        assert f"lock {lock} not taken within 0.2 s: held by PID {pid}" in error
    assert prepared.kind == "LockTimeout"
    assert state.prepare([ref("u1")])[ClaimUID("u1")].error == ""
    assert state.unprepare([ref("u2")]) == {"u2": ""}
    assert env.specs() == {"u1"} and env.checkpoint_claims() == {"u1": PREPARE_COMPLETED}
