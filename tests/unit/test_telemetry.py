"""GPU telemetry of the kubelet plugin: processes to pods by cgroup, samples to series with
claim and pod labels, idle claims and their Events, and the loop over a fake sampler and clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_gpu.devices import cgroups, naming, simulated, simulated_usage
from dra_gpu.devices.model import Device
from dra_gpu.devices.usage import DeviceUsage, ProcessUsage
from dra_gpu.kube import errors
from dra_gpu.plugin import idle_claims, telemetry, telemetry_wiring, usage_series
from dra_gpu.plugin.claim_pods import ClaimPods
from dra_gpu.plugin.telemetry_metrics import TelemetryCollector
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimRecord,
    DeviceRecord,
)

NODE = "node-a"
POD_A = "0d6a8e43-1f2b-4c3d-9e8f-1a2b3c4d5e6f"
POD_B = "7b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"

# --- cgroup path -> pod UID ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "uid"),
    [
        # cgroup v2, systemd driver (dashes of the UID become underscores)
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            "0d6a8e43_1f2b_4c3d_9e8f_1a2b3c4d5e6f.slice/cri-containerd-ab12.scope\n",
            POD_A,
        ),
        # guaranteed QoS, systemd: directly under kubepods.slice
        (
            "0::/kubepods.slice/kubepods-pod7b1c2d3e_4f50_4617_8293_a4b5c6d7e8f9.slice/x.scope",
            POD_B,
        ),
        # cgroup v2, cgroupfs driver
        (f"0::/kubepods/besteffort/pod{POD_A}/0123456789abcdef\n", POD_A),
        # cgroup v1: the memory hierarchy among others
        (f"12:pids:/\n11:memory:/kubepods/pod{POD_B}/feed\n1:name=systemd:/\n", POD_B),
        # kind / nested: the node's own cgroup in front
        (f"0::/kubelet.slice/kubelet-kubepods.slice/kubepods/burstable/pod{POD_A}/c\n", POD_A),
        # a static pod: its UID is the config hash
        (
            "0::/kubepods/burstable/pod6f1e2d3c4b5a69788796a5b4c3d2e1f0/c\n",
            "6f1e2d3c4b5a69788796a5b4c3d2e1f0",
        ),
        # not in a pod
        ("0::/system.slice/sshd.service\n", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("", None),
        # "pod" inside another name is not a pod cgroup
        ("0::/system.slice/podman-1234.scope\n", None),
    ],
)
def test_pod_uid_from_cgroup(text: str, uid: str | None) -> None:
    assert cgroups.pod_uid(text) == uid


def test_pod_uid_of_a_pid_under_a_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{POD_A}/c\n")
    assert cgroups.pod_uid_of_pid(4242, proc_root=tmp_path) == POD_A
    assert cgroups.pod_uid_of_pid(4243, proc_root=tmp_path) is None  # gone: unknown, no error


# --- samples -> rows -----------------------------------------------------------------------


def devices(profile: str = "h200x8") -> list[Device]:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name=NODE
    )
    return naming.build_devices(backend.discover().gpus)


def record(
    name: str,
    *device_names: str,
    state: str = PREPARE_COMPLETED,
    mps: bool = False,
    admin: bool = False,
    pool: str = NODE,
    share: str | None = None,
) -> ClaimRecord:
    config: dict[str, Any] = {"sharing": {"strategy": "MPS" if mps else "TimeSlicing"}}
    if mps:
        config["sharing"]["mpsConfig"] = {"defaultActiveThreadPercentage": 50}
    return ClaimRecord(
        state=state,  # type: ignore[arg-type]
        namespace="team",
        name=name,
        devices=tuple(
            DeviceRecord(
                pool=pool,
                device=d,
                config=config,
                admin_access=admin,
                share_id=share,
                consumed={"memory": 40 << 30} if share else None,
            )
            for d in device_names
        ),
    )


def usage(util: float | None, *processes: ProcessUsage, error: str = "") -> DeviceUsage:
    return DeviceUsage(
        utilization_ratio=util,
        memory_used_bytes=sum(p.memory_bytes or 0 for p in processes),
        memory_total_bytes=150754820096,
        temperature_celsius=40.0,
        power_watts=150.0,
        processes=processes,
        error=error,
    )


def pods(**claims: dict[str, str]) -> dict[str, dict[str, usage_series.PodRef]]:
    return {
        uid: {pod_uid: usage_series.PodRef("team", name) for pod_uid, name in members.items()}
        for uid, members in claims.items()
    }


def test_holders_are_the_prepared_claims_of_this_node() -> None:
    held = usage_series.holders(
        {
            "u1": record("one", "gpu-0", "gpu-1"),
            "u2": record("starting", "gpu-2", state=PREPARE_STARTED),
            "u3": record("elsewhere", "gpu-3", pool="other-node"),
        },
        pool=NODE,
    )
    assert {name: [h.name for h in hs] for name, hs in held.items()} == {
        "gpu-0": ["one"],
        "gpu-1": ["one"],
    }


def test_a_time_sliced_claim_shared_by_two_pods_shows_each_pods_memory_and_share() -> None:
    devs = devices()
    held = usage_series.holders({"u1": record("shared", "gpu-0")}, pool=NODE)
    sample = usage(
        0.6,
        ProcessUsage(10, POD_A, 776 << 20, 0.6),
        ProcessUsage(11, POD_A, 10 << 20, 0.0),
        ProcessUsage(20, POD_B, 1544 << 20, 0.0),
    )
    view = usage_series.build_view(
        node=NODE,
        devices=devs,
        usage={"gpu-0": sample, "gpu-1": usage(0.0)},
        held=held,
        pods=pods(u1={POD_A: "busy", POD_B: "idle"}),
    )
    gpu0 = next(r for r in view.devices if r.device.name == "gpu-0")
    assert gpu0.labels["claim_name"] == "shared" and gpu0.labels["product"] == "NVIDIA H200"
    gpu1 = next(r for r in view.devices if r.device.name == "gpu-1")
    assert gpu1.labels["claim_name"] == ""  # nobody holds it
    by_pod = {r.labels["pod_name"]: r for r in view.pods}
    assert by_pod["busy"].memory_bytes == 786 << 20 and by_pod["busy"].processes == 2
    assert by_pod["busy"].utilization_ratio == pytest.approx(0.6)
    assert by_pod["idle"].memory_bytes == 1544 << 20 and by_pod["idle"].utilization_ratio == 0
    assert by_pod["idle"].labels["claim_name"] == "shared"
    assert view.unknown_pods == {}


def test_under_mps_pods_have_memory_but_no_utilization() -> None:
    held = usage_series.holders({"u1": record("mps", "gpu-0", mps=True)}, pool=NODE)
    view = usage_series.build_view(
        node=NODE,
        devices=devices(),
        usage={"gpu-0": usage(0.99, ProcessUsage(10, POD_A, 774 << 20, 0.0))},
        held=held,
        pods=pods(u1={POD_A: "client"}),
    )
    (row,) = view.pods
    assert row.memory_bytes == 774 << 20 and row.utilization_ratio is None
    assert row.compute_share == 0.5  # what the claim's mpsConfig allows each client
    assert view.devices[0].usage.utilization_ratio == 0.99  # the GPU's, whole
    s = scrape(telemetry.Snapshot(view))
    assert series(s, "dra_gpu_pod_utilization_ratio") == []
    assert series(s, "dra_gpu_pod_compute_share_ratio", pod_name="client") == [0.5]


def test_a_pod_the_claim_does_not_name_is_kept_by_uid_and_asked_about() -> None:
    held = usage_series.holders({"u1": record("c", "gpu-0")}, pool=NODE)
    view = usage_series.build_view(
        node=NODE,
        devices=devices(),
        usage={
            "gpu-0": usage(0.5, ProcessUsage(10, POD_B, 1 << 20, 0.5), ProcessUsage(9, None, 5))
        },
        held=held,
        pods=pods(u1={POD_A: "known"}),
    )
    rows = {r.pod_uid: r for r in view.pods}
    assert rows[POD_B].labels["pod_name"] == "" and rows[POD_B].labels["claim_name"] == "c"
    assert rows[""].labels["claim_name"] == ""  # outside Kubernetes: no claim of ours
    assert view.unknown_pods == {"u1": frozenset({POD_B})}


def test_an_admin_access_claim_is_named_next_to_the_users_claim_not_instead() -> None:
    held = usage_series.holders(
        {"u0": record("admin", "gpu-0", admin=True), "u1": record("user", "gpu-0")}, pool=NODE
    )
    view = usage_series.build_view(
        node=NODE, devices=devices(), usage={"gpu-0": usage(0.0)}, held=held, pods={}
    )
    assert [r.labels["claim_name"] for r in view.devices] == ["user", "admin"]
    # The monitoring claim computes nothing by design: never reported idle; the user's is.
    subjects = idle_claims.activity(view, threshold=0.01, pods={})
    assert [s.claim_uid for s in subjects] == ["u1"]


def test_every_share_of_a_gpu_has_its_device_series_and_its_own_pods() -> None:
    held = usage_series.holders(
        {"u1": record("a", "gpu-0", share="s-1"), "u2": record("b", "gpu-0", share="s-2")},
        pool=NODE,
    )
    stranger = "11111111-2222-4333-8444-555555555555"
    view = usage_series.build_view(
        node=NODE,
        devices=devices(),
        usage={
            "gpu-0": usage(
                0.7, ProcessUsage(10, POD_A, 2 << 30, 0.7), ProcessUsage(5, stranger, 1, 0.0)
            )
        },
        held=held,
        pods=pods(u1={POD_A: "a-0"}, u2={POD_B: "b-0"}),
    )
    s = scrape(telemetry.Snapshot(view))
    for name in ("a", "b"):
        assert series(s, "dra_gpu_device_utilization_ratio", device="gpu-0", claim_name=name) == [
            0.7
        ]
    assert series(s, "dra_gpu_pod_memory_used_bytes", claim_name="a", pod_name="a-0") == [2 << 30]
    assert series(s, "dra_gpu_pod_processes", claim_name="b") == []
    # a pod neither share names is counted for neither; both are asked about it
    assert series(s, "dra_gpu_pod_processes", pod_uid=stranger, claim_name="") == [1]
    assert view.unknown_pods == {"u1": frozenset({stranger}), "u2": frozenset({stranger})}


# --- the collector -------------------------------------------------------------------------


def scrape(snapshot: telemetry.Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(lambda: snapshot))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(s: Mapping[tuple[str, Any], float], name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in s.items() if n == name and labels.items() <= dict(ls).items()]


def test_series_carry_node_device_claim_and_pod_labels() -> None:
    held = usage_series.holders({"u1": record("train", "gpu-3")}, pool=NODE)
    view = usage_series.build_view(
        node=NODE,
        devices=devices(),
        usage={"gpu-3": usage(0.4, ProcessUsage(10, POD_A, 2 << 30, 0.4)), "gpu-4": usage(None)},
        held=held,
        pods=pods(u1={POD_A: "trainer"}),
    )
    s = scrape(telemetry.Snapshot(view))
    claim = {"node": NODE, "device": "gpu-3", "claim_namespace": "team", "claim_name": "train"}
    assert series(s, "dra_gpu_device_utilization_ratio", **claim) == [0.4]
    assert series(s, "dra_gpu_device_memory_total_bytes", **claim) == [150754820096]
    assert series(s, "dra_gpu_device_power_watts", **claim) == [150.0]
    assert series(s, "dra_gpu_device_temperature_celsius", **claim) == [40.0]
    assert series(
        s,
        "dra_gpu_pod_memory_used_bytes",
        pod_name="trainer",
        pod_uid=POD_A,
        pod_namespace="team",
        **claim,
    ) == [2 << 30]
    assert series(s, "dra_gpu_pod_utilization_ratio", pod_name="trainer") == [0.4]
    # unknown is left out, never 0
    assert series(s, "dra_gpu_device_utilization_ratio", device="gpu-4") == []
    assert series(s, "dra_gpu_device_memory_used_bytes", device="gpu-4", claim_name="") == [0]


def test_a_failed_sample_is_telemetry_down_without_values() -> None:
    view = usage_series.build_view(
        node=NODE,
        devices=devices(),
        usage={"gpu-0": DeviceUsage(error="nvmlDeviceGetMemoryInfo did not return within 10s")},
        held={},
        pods={},
    )
    s = scrape(telemetry.Snapshot(view))
    assert series(s, "dra_gpu_device_telemetry_up", device="gpu-0") == [0]
    assert series(s, "dra_gpu_device_processes", device="gpu-0") == []


# --- idle ----------------------------------------------------------------------------------


def test_idle_tracker_reports_once_per_idle_period() -> None:
    holder = usage_series.Holder("u1", "team", "c")
    tracker = idle_claims.IdleTracker(idle_after_s=60)
    subject = idle_claims.Subject("u1")

    def seen(busy: bool) -> dict[idle_claims.Subject, idle_claims.Activity]:
        return {subject: idle_claims.Activity(busy, 0, ("gpu-0",), holder)}

    assert tracker.observe(0, seen(False)) == []
    assert tracker.observe(59, seen(False)) == []
    (idle,) = tracker.observe(60, seen(False))
    assert idle.seconds == 60
    assert tracker.observe(120, seen(False)) == []  # once
    assert tracker.idle_seconds(120) == {subject: 120}
    assert tracker.observe(130, seen(True)) == []  # work: cleared
    assert tracker.idle_seconds(130) == {}
    assert tracker.observe(140, seen(False)) == []
    assert len(tracker.observe(200, seen(False))) == 1  # a new idle period is reported again
    assert tracker.observe(210, {}) == [] and tracker.idle_seconds(210) == {}  # claim gone


@pytest.mark.parametrize(
    ("seconds", "text"), [(1800, "30m"), (60, "1m"), (90, "1m30s"), (7200, "2h"), (5, "5s")]
)
def test_duration_text(seconds: float, text: str) -> None:
    assert idle_claims.duration_text(seconds) == text


def test_idle_message_names_the_gpu_the_time_and_the_processes() -> None:
    idle = idle_claims.Idle(
        idle_claims.Subject("u1"),
        idle_claims.Activity(False, 0, ("gpu-3",), usage_series.Holder("u1", "team", "c")),
        1800,
    )
    text = idle_claims.message(idle, node=NODE)
    assert text.startswith("GPU gpu-3 idle for 30m, 0 processes")
    assert "team/c" in text and NODE in text


# --- the loop ------------------------------------------------------------------------------


class FakeSampler:
    def __init__(self) -> None:
        self.now: dict[str, DeviceUsage] = {}
        self.closed = False

    def sample(self, devices: Sequence[Device]) -> Mapping[str, DeviceUsage]:
        return {d.name: self.now.get(d.name, usage(0.0)) for d in devices}

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def claim_json(uid: str, name: str, *members: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": name, "uid": uid},
        "status": {"reservedFor": [{"resource": "pods", "name": n, "uid": u} for u, n in members]},
    }


class Api:
    """The claims the API server holds, and the GETs and Events it saw."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.gets: list[str] = []
        self.events: list[tuple[Mapping[str, str], str]] = []
        self.down = False

    def get(self, namespace: str, name: str) -> Any:
        self.gets.append(name)
        if self.down:
            raise errors.ApiError("connection refused", request="GET claim")
        return self.claims.get(name)

    def post(self, involved: Mapping[str, str], message: str) -> None:
        self.events.append((involved, message))


def loop(
    api: Api,
    sampler: FakeSampler,
    claims: dict[str, ClaimRecord],
    clock: Clock,
    idle_after_s: float = 1800,
) -> telemetry.Telemetry:
    return telemetry.Telemetry(
        node=NODE,
        sampler=sampler,
        devices=devices,
        claims=lambda: claims,
        pods=ClaimPods(api.get, clock=clock),
        idle=telemetry.IdleSettings(idle_after_s, 0.01),
        post=api.post,
        clock=clock,
    )


def test_an_idle_claim_gets_one_event_on_it_and_its_pods_and_a_busy_one_none() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["idle"] = claim_json("u1", "idle", (POD_A, "sleeper"))
    api.claims["busy"] = claim_json("u2", "busy", (POD_B, "trainer"))
    claims = {"u1": record("idle", "gpu-3"), "u2": record("busy", "gpu-4")}
    sampler.now["gpu-4"] = usage(0.9, ProcessUsage(7, POD_B, 1 << 30, 0.9))
    t = loop(api, sampler, claims, clock)
    for _ in range(180):  # 30 minutes of 10 s passes
        t.run_once()
        clock.t += 10
    assert api.events == []
    t.run_once()
    assert [(o["kind"], o["name"]) for o, _ in api.events] == [
        ("ResourceClaim", "idle"),
        ("Pod", "sleeper"),
    ]
    assert api.events[0][1].startswith("GPU gpu-3 idle for 30m, 0 processes")
    for _ in range(10):
        clock.t += 10
        t.run_once()
    assert len(api.events) == 2  # once per idle period
    idle = {i.activity.claim.name: i.seconds for i in t.snapshot.idle if not i.subject.pod_uid}
    assert idle == {"idle": 1900, "busy": 0}
    # read when first seen, then every 5 minutes: not at each of the 191 passes
    assert api.gets.count("idle") == 1 + 1900 // 300

    sampler.now["gpu-3"] = usage(0.5, ProcessUsage(8, POD_A, 1 << 20, 0.5))  # work starts
    clock.t += 10
    t.run_once()
    idle = {i.activity.claim.name: i.seconds for i in t.snapshot.idle if not i.subject.pod_uid}
    assert idle == {"idle": 0, "busy": 0}


def test_idle_events_carry_what_the_charts_policy_requires() -> None:
    # The chart's policy `claim-events` admits a GpuIdle Warning about a Pod or ResourceClaim of
    # the Event's own namespace, with source.host the plugin's node and nothing related: an
    # Event without them is refused in a deployed cluster (tests/cluster/test_manifests.py).
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["idle"] = claim_json("u1", "idle", (POD_A, "sleeper"))
    t = loop(api, sampler, {"u1": record("idle", "gpu-3")}, clock, idle_after_s=10)
    t.run_once()
    clock.t += 10
    t.run_once()
    posted = [telemetry_wiring.idle_event(o, m, node=NODE) for o, m in api.events]
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in posted] == [
        ("ResourceClaim", "idle"),
        ("Pod", "sleeper"),
    ]
    for event in posted:
        assert event["metadata"]["namespace"] == event["involvedObject"]["namespace"] == "team"
        assert (event["reason"], event["type"]) == ("GpuIdle", "Warning")
        assert event["source"]["host"] == NODE
        assert "related" not in event
        assert event.get("reportingInstance", NODE) == NODE


def test_the_idle_pod_of_a_shared_claim_gets_the_event_alone() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["shared"] = claim_json("u1", "shared", (POD_A, "busy"), (POD_B, "idle"))
    claims = {"u1": record("shared", "gpu-0")}
    sampler.now["gpu-0"] = usage(
        0.6, ProcessUsage(10, POD_A, 776 << 20, 0.6), ProcessUsage(20, POD_B, 1544 << 20, 0.0)
    )
    t = loop(api, sampler, claims, clock, idle_after_s=60)
    for _ in range(7):
        t.run_once()
        clock.t += 10
    assert [(o["kind"], o["name"]) for o, _ in api.events] == [("Pod", "idle")]
    assert "in pod idle" in api.events[0][1] and "1 process" in api.events[0][1]


@pytest.mark.parametrize("mps", [False, True])
def test_of_two_shares_of_a_gpu_the_idle_one_gets_gpu_idle_and_the_busy_one_not(
    mps: bool,
) -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["busy"] = claim_json("u1", "busy", (POD_A, "trainer"))
    api.claims["idle"] = claim_json("u2", "idle", (POD_B, "notebook"))
    claims = {
        "u1": record("busy", "gpu-0", mps=mps, share="s-1"),
        "u2": record("idle", "gpu-0", mps=mps, share="s-2"),
    }
    # The GPU is busy with the trainer's work; under MPS its client reads 0 (the server has the
    # samples) and the server runs in the plugin's pod, which neither claim names.
    server = "11111111-2222-4333-8444-555555555555"
    sampler.now["gpu-0"] = usage(
        0.9,
        ProcessUsage(10, POD_A, 2 << 30, 0.0 if mps else 0.9),
        *([ProcessUsage(5, server, 30 << 20, 0.9)] if mps else []),
    )
    t = loop(api, sampler, claims, clock, idle_after_s=60)
    for _ in range(7):
        t.run_once()
        clock.t += 10
    assert [(o["kind"], o["name"]) for o, _ in api.events] == [
        ("ResourceClaim", "idle"),
        ("Pod", "notebook"),
    ]
    assert api.events[0][1].startswith("GPU gpu-0 idle for 1m, 0 processes (claim team/idle")
    s = scrape(t.snapshot)
    assert series(s, "dra_gpu_claim_idle_seconds", claim_name="idle") == [60]
    assert series(s, "dra_gpu_claim_idle_seconds", claim_name="busy") == [0]


def test_a_claim_alone_on_a_gpu_without_utilization_is_busy_while_it_has_a_process() -> None:
    mig = next(d for d in devices("a100x4-mig") if d.mig is not None)
    held = usage_series.holders({"u1": record("m", mig.name)}, pool=NODE)
    seen: dict[str, bool] = {}
    for name, processes in (("working", (ProcessUsage(10, POD_A, 1 << 30),)), ("idle", ())):
        view = usage_series.build_view(
            node=NODE,
            devices=[mig],
            usage={mig.name: usage(None, *processes)},
            held=held,
            pods=pods(u1={POD_A: "p"}),
        )
        (act,) = idle_claims.activity(view, threshold=0.01, pods={}).values()
        seen[name] = act.busy
    assert seen == {"working": True, "idle": False}


def test_a_failing_sample_never_makes_a_claim_idle() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["c"] = claim_json("u1", "c", (POD_A, "p"))
    sampler.now["gpu-0"] = DeviceUsage(error="nvmlDeviceGetHandleByUUID did not return")
    t = loop(api, sampler, {"u1": record("c", "gpu-0")}, clock, idle_after_s=60)
    for _ in range(20):
        t.run_once()
        clock.t += 10
    assert api.events == []
    assert t.snapshot.errors == {"gpu-0": "nvmlDeviceGetHandleByUUID did not return"}


def test_a_pod_that_joins_a_shared_claim_later_is_named_after_one_more_get() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["c"] = claim_json("u1", "c", (POD_A, "first"))
    t = loop(api, sampler, {"u1": record("c", "gpu-0")}, clock)
    t.run_once()
    api.claims["c"] = claim_json("u1", "c", (POD_A, "first"), (POD_B, "second"))
    sampler.now["gpu-0"] = usage(0.3, ProcessUsage(20, POD_B, 1 << 20, 0.3))
    clock.t += 10
    t.run_once()
    assert [r.labels["pod_name"] for r in t.snapshot.view.pods] == [""]  # asked too recently
    clock.t += 30
    t.run_once()
    assert [r.labels["pod_name"] for r in t.snapshot.view.pods] == ["second"]
    clock.t += 10
    t.run_once()
    assert api.gets == ["c", "c"]


def test_an_unreachable_api_server_leaves_pods_unnamed_not_the_loop_stopped() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.down = True
    sampler.now["gpu-0"] = usage(0.3, ProcessUsage(20, POD_A, 1 << 20, 0.3))
    t = loop(api, sampler, {"u1": record("c", "gpu-0")}, clock)
    t.run_once()
    (row,) = t.snapshot.view.pods
    assert row.pod_uid == POD_A and row.labels["pod_name"] == ""
    assert row.labels["claim_name"] == "c"


def test_the_loop_stops_with_the_plugin_and_closes_its_sampler() -> None:
    import threading

    api, sampler, clock = Api(), FakeSampler(), Clock()
    stop = threading.Event()
    t = loop(api, sampler, {}, clock)
    thread = t.start(stop)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and sampler.closed


# --- simulated GPUs ------------------------------------------------------------------------


def test_simulated_usage_comes_from_the_file_and_unlisted_devices_are_idle(
    tmp_path: Path,
) -> None:
    path = tmp_path / simulated_usage.FILE_NAME
    sampler = simulated_usage.SimulatedUsageSampler(path)
    devs = devices()[:2]
    assert {n: u.utilization_ratio for n, u in sampler.sample(devs).items()} == {
        "gpu-0": 0.0,
        "gpu-1": 0.0,
    }
    path.write_text(
        json.dumps(
            {
                "devices": {
                    "gpu-1": {
                        "utilization": 0.85,
                        "powerWatts": 420,
                        "processes": [{"pid": 4242, "podUID": POD_A, "memoryBytes": 2 << 30}],
                    }
                }
            }
        )
    )
    got = sampler.sample(devs)
    assert got["gpu-1"].utilization_ratio == 0.85 and got["gpu-1"].power_watts == 420
    assert got["gpu-1"].memory_used_bytes == 2 << 30
    assert got["gpu-1"].processes == (ProcessUsage(4242, POD_A, 2 << 30, 0.0),)
    assert got["gpu-0"].processes == ()

    path.write_text('{"devices": {"gpu-1": {"utilisation": 1}}}')  # a typo
    broken = sampler.sample(devs)
    assert all("utilisation" in u.error for u in broken.values()), broken


def test_simulated_mig_devices_have_memory_but_no_utilization(tmp_path: Path) -> None:
    path = tmp_path / simulated_usage.FILE_NAME
    mig = next(d for d in devices("a100x4-mig") if d.mig is not None)
    path.write_text(json.dumps({"devices": {mig.name: {"utilization": 0.5}}}))
    got = simulated_usage.SimulatedUsageSampler(path).sample([mig])[mig.name]
    assert got.utilization_ratio is None
    assert mig.mig is not None and got.memory_total_bytes == mig.mig.memory_bytes


# --- flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "interval", "idle_after"),
    [
        ({}, 10.0, 1800.0),
        ({"telemetry_interval": "0"}, None, 1800.0),
        ({"idle_after": "60s"}, 10.0, 60.0),
        ({"idle_after": "1h", "telemetry_interval": "2.5"}, 2.5, 3600.0),
        ({"idle_after": "0"}, 10.0, None),
        ({"idle_after": "90"}, 10.0, 90.0),
    ],
)
def test_telemetry_flags(
    flags: dict[str, str], interval: float | None, idle_after: float | None
) -> None:
    from dra_gpu.plugin import settings

    got = settings.build_settings({"node_name": NODE, **flags}, {})
    assert (got.telemetry_interval_s, got.idle_after_s) == (interval, idle_after)


@pytest.mark.parametrize(
    "flags", [{"idle_after": "30 minutes"}, {"idle_threshold": "2"}, {"telemetry_interval": "-1"}]
)
def test_bad_telemetry_flags_are_refused(flags: dict[str, str]) -> None:
    from dra_gpu.plugin import settings

    with pytest.raises(settings.SettingsError):
        settings.build_settings({"node_name": NODE, **flags}, {})


def test_a_checkpoint_that_cannot_be_read_for_a_pass_keeps_the_labels_and_idle_time() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["c"] = claim_json("u1", "c", (POD_A, "p"))
    held = {"u1": record("c", "gpu-0")}
    failing = [False]

    def claims() -> dict[str, ClaimRecord]:
        if failing[0]:
            raise TimeoutError("checkpoint lock not taken within 10 s")
        return held

    t = telemetry.Telemetry(
        node=NODE,
        sampler=sampler,
        devices=devices,
        claims=claims,
        pods=ClaimPods(api.get, clock=clock),
        idle=telemetry.IdleSettings(60, 0.01),
        post=api.post,
        clock=clock,
    )
    t.run_once()
    clock.t += 40
    failing[0] = True
    t.run_once()
    assert t.snapshot.view.devices[0].labels["claim_name"] == "c"
    clock.t += 30
    t.run_once()
    assert [o["kind"] for o, _ in api.events] == ["ResourceClaim", "Pod"]  # 70 s idle in all


def test_a_process_of_a_pod_the_claim_never_names_costs_one_more_get_not_one_a_pass() -> None:
    api, sampler, clock = Api(), FakeSampler(), Clock()
    api.claims["c"] = claim_json("u1", "c", (POD_A, "client"))
    plugin_pod = "11111111-2222-4333-8444-555555555555"  # e.g. the MPS server's pod
    sampler.now["gpu-0"] = usage(0.9, ProcessUsage(5, plugin_pod, 30 << 20, 0.9))
    t = loop(api, sampler, {"u1": record("c", "gpu-0")}, clock)
    for _ in range(20):  # 200 s
        t.run_once()
        clock.t += 10
    assert api.gets == ["c"]  # the first read already said the stranger is not its pod


def test_xid_and_ecc_events_the_health_monitor_sees_are_counted_per_gpu() -> None:
    from dra_gpu.devices import health_rules
    from dra_gpu.devices.health_events import HealthEvent
    from dra_gpu.plugin.health_monitor import HealthMonitor

    devs = devices()
    monitor = HealthMonitor(
        rules=health_rules.Rules(),
        driver="gpu.nvidia.com",
        devices=devs,
        publish=lambda *a, **kw: None,
        probe=lambda gpu: True,
        commands=None,
        accept_injected=False,
    )
    gpu3 = next(d for d in devs if d.name == "gpu-3")
    assert gpu3.uuid is not None
    for code in (79, 13, 79):  # taken, ignored by the default rules, taken again
        monitor.submit(HealthEvent(gpu3.uuid, "xid", code))
    monitor.submit(HealthEvent(gpu3.uuid, "ecc-double-bit"))
    view = usage_series.build_view(
        node=NODE, devices=devs, usage={"gpu-3": usage(0.0)}, held={}, pods={}
    )
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(lambda: telemetry.Snapshot(view), monitor.event_counts))
    s = {
        (x.name, x.labels.get("kind"), x.labels.get("device")): x.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for x in f.samples
        if x.name == "dra_gpu_device_health_events_total"
    }
    assert s == {
        ("dra_gpu_device_health_events_total", "xid", "gpu-3"): 3,
        ("dra_gpu_device_health_events_total", "ecc-double-bit", "gpu-3"): 1,
    }
