"""Run one scenario of ``e2e/scenarios/<name>/`` against a cluster and judge it.

A scenario's manifests are created in a fresh namespace; the runner waits for its pods, reads what
each container reported, and compares it with its claims' allocation (``views.mismatches``) plus the
scenario's own checks. Then it deletes the pods and verifies the driver unprepared: the claims'
CDI specs disappear from the node (when the runner can see the node's CDI directory) and the
claims are deallocated or deleted. Every problem is collected; one ``ScenarioFailed`` reports all.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client import ApiException

from e2e.suite import views
from e2e.suite.kube import Kube, load_manifests, wait_for
from e2e.suite.needs import Need, refuse_unmet

SCENARIOS_DIR = Path(__file__).resolve().parent.parent / "scenarios"
Log = Callable[[str], None]


class ScenarioFailed(AssertionError):
    pass


@dataclass(frozen=True)
class ContainerResult:
    pod: str
    container: str
    node: str
    view: views.ContainerView
    devices: tuple[str, ...]  # allocated to this container (our driver's results)
    pools: Mapping[str, str]  # device name -> pool it was allocated from


@dataclass
class Run:
    """What one execution of a scenario observed."""

    namespace: str
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # claim name -> object
    containers: list[ContainerResult] = field(default_factory=list)

    def devices(self) -> set[str]:
        return {d for c in self.containers for d in c.devices}


@dataclass(frozen=True)
class Context:
    kube: Kube
    cdi_dirs: tuple[Path, ...] = ()  # the nodes' CDI dirs, when visible to the runner
    timeout: float = 120.0
    log: Log = print
    scenarios_dir: Path = SCENARIOS_DIR
    # Added to every pod: keeps pods off nodes that have no kubelet (the local harness's
    # simulated nodes publish devices too, but nothing would ever run a pod there).
    node_selector: Mapping[str, str] = field(default_factory=dict)


Check = Callable[[Context, Run], list[str]]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    checks: tuple[Check, ...] = ()
    # "running": pods run and see their devices; "pending": unschedulable, the scheduler says
    # why; "prepare-fails": refused by the admission webhook, or the pod gets an event naming
    # ``problem`` (preparing failed on the node).
    expect: str = "running"
    problem: str = ""
    repeat: int = 1  # run again after cleanup: the same devices must be allocatable again
    # What the cluster must support (``needs``); a version that lacks it refuses the scenario.
    needs: tuple[Need, ...] = ()


def with_node_selector(pod: dict[str, Any], selector: Mapping[str, str]) -> dict[str, Any]:
    if not selector:
        return pod
    spec = {**pod["spec"], "nodeSelector": {**(pod["spec"].get("nodeSelector") or {}), **selector}}
    return {**pod, "spec": spec}


def _pod_summary(ctx: Context, namespace: str, name: str) -> str:
    pod = ctx.kube.pod(namespace, name)
    status = pod.get("status") or {}
    conds = [f"{c['type']}={c['status']}" for c in status.get("conditions") or []]
    events = [f"{e.get('reason')}: {e.get('message')}" for e in ctx.kube.events(namespace, name)]
    return f"pod {name} phase={status.get('phase')} {conds} events={events}"


def _wait_running(ctx: Context, run: Run, name: str) -> None:
    def running() -> dict[str, Any] | None:
        pod = ctx.kube.pod(run.namespace, name)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            raise ScenarioFailed(f"pod {name} ended ({phase}) instead of running")
        return pod if phase == "Running" else None

    try:
        run.pods[name] = wait_for(f"pod {name} Running", running, timeout=ctx.timeout)
    except AssertionError as e:
        raise ScenarioFailed(f"{e}\n  {_pod_summary(ctx, run.namespace, name)}") from None


def _observe(ctx: Context, run: Run, name: str) -> list[str]:
    pod = run.pods[name]
    claim_names = views.pod_claim_names(pod)
    extended_claim, _ = views.extended_requests(pod, "")
    for claim_name in [*claim_names.values(), extended_claim]:
        claim = ctx.kube.claim(run.namespace, claim_name) if claim_name else None
        if claim is not None:
            run.claims[claim_name] = claim
    problems = []
    for container in pod["spec"]["containers"]:
        cname = container["name"]
        view = wait_for(
            f"{name}/{cname} to print its report",
            functools.partial(_report, ctx, run.namespace, name, cname),
            timeout=ctx.timeout,
        )
        devices: list[str] = []
        pools: dict[str, str] = {}
        for ref in (container.get("resources") or {}).get("claims") or []:
            claim = run.claims.get(claim_names.get(ref["name"], ""), {})
            devices += views.allocated_devices(claim, request=ref.get("request"))
            pools.update(_pools(claim))
        extended_claim, requests = views.extended_requests(pod, cname)
        for request in requests:
            claim = run.claims.get(extended_claim, {})
            devices += views.allocated_devices(claim, request=request)
            pools.update(_pools(claim))
        result = ContainerResult(
            name, cname, pod["spec"].get("nodeName", ""), view, tuple(devices), pools
        )
        run.containers.append(result)
        problems += [f"{name}/{cname}: {p}" for p in views.mismatches(view, devices)]
    return problems


def _report(ctx: Context, namespace: str, pod: str, container: str) -> views.ContainerView | None:
    try:
        return views.parse_report(ctx.kube.log(namespace, pod, container))
    except views.LogIncomplete:
        return None


def _pools(claim: Mapping[str, Any]) -> dict[str, str]:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    return {r["device"]: r["pool"] for r in results.get("results") or []}


def _cdi_specs_for(ctx: Context, uid: str) -> list[Path]:
    return [p for d in ctx.cdi_dirs for p in d.glob(f"*{uid}*")]


def _check_cdi_present(ctx: Context, run: Run) -> list[str]:
    problems = []
    for name, claim in run.claims.items():
        if ctx.cdi_dirs and not _cdi_specs_for(ctx, claim["metadata"]["uid"]):
            problems.append(f"claim {name} is prepared but has no CDI spec in {ctx.cdi_dirs}")
    return problems


def _teardown(ctx: Context, run: Run, pod_names: Sequence[str]) -> list[str]:
    """Delete the pods; the driver must unprepare (CDI specs gone) and claims be released."""
    ctx.kube.delete_pods(run.namespace, pod_names)
    for name in pod_names:
        wait_for(f"pod {name} deleted", _absent(ctx, run.namespace, name), timeout=ctx.timeout)
    problems = []
    for name, claim in run.claims.items():
        uid = claim["metadata"]["uid"]
        try:
            wait_for(f"CDI spec of claim {name} removed", _no_cdi_spec(ctx, uid), timeout=60)
            wait_for(f"claim {name} released", _released(ctx, run.namespace, name), timeout=60)
        except AssertionError as e:
            problems.append(str(e))
    return problems


def _absent(ctx: Context, namespace: str, pod: str) -> Callable[[], bool | None]:
    return lambda: None if ctx.kube.pod_exists(namespace, pod) else True


def _no_cdi_spec(ctx: Context, uid: str) -> Callable[[], bool | None]:
    return lambda: None if _cdi_specs_for(ctx, uid) else True


def _released(ctx: Context, namespace: str, name: str) -> Callable[[], bool | None]:
    def probe() -> bool | None:
        claim = ctx.kube.claim(namespace, name)
        if claim is None:
            return True
        status = claim.get("status") or {}
        return True if not status.get("allocation") and not status.get("reservedFor") else None

    return probe


def _manifests(ctx: Context, scenario: Scenario) -> tuple[list[dict[str, Any]], list[str]]:
    """The scenario's documents (pods last, with the context's node selector) and pod names."""
    docs = load_manifests(ctx.scenarios_dir / scenario.name)
    pods = [with_node_selector(d, ctx.node_selector) for d in docs if d["kind"] == "Pod"]
    return [d for d in docs if d["kind"] != "Pod"] + pods, [p["metadata"]["name"] for p in pods]


def start(ctx: Context, scenario: Scenario) -> tuple[Run, list[str]]:
    """Create a running scenario in a new namespace, wait for its pods, judge what they saw.

    The pods keep running; ``finish`` deletes them and checks the driver unprepared.
    """
    run = Run(namespace=f"e2e-{scenario.name}-{secrets.token_hex(3)}")
    docs, names = _manifests(ctx, scenario)
    ctx.kube.create_namespace(run.namespace)
    try:
        for doc in docs:
            ctx.kube.create(run.namespace, doc)
        for name in names:
            _wait_running(ctx, run, name)
        problems: list[str] = []
        for name in names:
            problems += _observe(ctx, run, name)
        problems += _check_cdi_present(ctx, run)
        for check in scenario.checks:
            problems += check(ctx, run)
    except BaseException:
        ctx.kube.delete_namespace(run.namespace)
        raise
    return run, problems


def finish(ctx: Context, run: Run) -> list[str]:
    """Delete the run's pods, check unprepare and release, then delete its namespace."""
    try:
        return _teardown(ctx, run, list(run.pods))
    finally:
        ctx.kube.delete_namespace(run.namespace)


def _run_once(ctx: Context, scenario: Scenario) -> tuple[Run, list[str]]:
    if scenario.expect == "running":
        started, problems_at_start = start(ctx, scenario)
        return started, problems_at_start + finish(ctx, started)
    run = Run(namespace=f"e2e-{scenario.name}-{secrets.token_hex(3)}")
    docs, names = _manifests(ctx, scenario)
    ctx.kube.create_namespace(run.namespace)
    try:
        if scenario.expect == "prepare-fails":
            return run, _prepare_fails(ctx, run, scenario, docs)
        for doc in docs:
            ctx.kube.create(run.namespace, doc)
        problems: list[str] = []
        for name in names:
            problems += _check_unschedulable(ctx, run, name)
        return run, problems
    finally:
        ctx.kube.delete_namespace(run.namespace)


def _prepare_fails(
    ctx: Context, run: Run, scenario: Scenario, docs: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The invalid config is refused at admission, or preparing it fails with a pod event."""
    for doc in [d for d in docs if d["kind"] != "Pod"]:
        try:
            ctx.kube.create(run.namespace, doc)
        except ApiException as e:
            ctx.log(f"  refused at admission: {e.body}")
            named = scenario.problem in str(e.body)
            return [] if named else [f"admission refusal does not name {scenario.problem!r}"]
    pods = [d for d in docs if d["kind"] == "Pod"]
    for pod in pods:
        ctx.kube.create(run.namespace, pod)
    problems = []
    for pod in pods:
        name = pod["metadata"]["name"]
        try:
            event = wait_for(
                f"a FailedPrepareDynamicResources event on pod {name}",
                functools.partial(_prepare_event, ctx, run.namespace, name),
                timeout=ctx.timeout,
            )
        except AssertionError as e:
            problems.append(f"{e}\n  {_pod_summary(ctx, run.namespace, name)}")
            continue
        ctx.log(f"  event: {event}")
        if scenario.problem not in event:
            problems.append(f"pod {name}: event does not name {scenario.problem!r}: {event}")
    return problems


def _prepare_event(ctx: Context, namespace: str, pod: str) -> str | None:
    for event in ctx.kube.events(namespace, pod):
        if event.get("reason") == "FailedPrepareDynamicResources":
            return str(event.get("message", ""))
    return None


def _check_unschedulable(ctx: Context, run: Run, name: str) -> list[str]:
    def unschedulable() -> dict[str, Any] | None:
        pod = ctx.kube.pod(run.namespace, name)
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return dict(cond)
        return None

    try:
        cond = wait_for(f"pod {name} reported unschedulable", unschedulable, timeout=ctx.timeout)
    except AssertionError as e:
        return [f"{e}\n  {_pod_summary(ctx, run.namespace, name)}"]
    run.pods[name] = ctx.kube.pod(run.namespace, name)
    message = str(cond.get("message", ""))
    ctx.log(f"  scheduler: {message}")
    if "cannot allocate all claims" not in message:
        return [f"pod {name}: the scheduler's reason does not name the claims: {message!r}"]
    return []


def run_scenario(ctx: Context, scenario: Scenario) -> list[Run]:
    """Run ``scenario`` (``repeat`` times); raise ``ScenarioFailed`` listing every problem, or
    ``needs.Refused`` when the cluster lacks what it needs."""
    refuse_unmet(ctx.kube, scenario.needs)  # raises needs.Refused, naming the version
    started = time.monotonic()
    runs: list[Run] = []
    problems: list[str] = []
    for _ in range(scenario.repeat):
        run, found = _run_once(ctx, scenario)
        runs.append(run)
        problems += found
    if len(runs) > 1 and any(r.devices() != runs[0].devices() for r in runs):
        problems.append(f"devices differ between runs: {[sorted(r.devices()) for r in runs]}")
    for run in runs:
        for c in run.containers:
            ctx.log(f"  {c.pod}/{c.container} on {c.node}: {sorted(c.view.device_names) or '-'}")
    if problems:
        raise ScenarioFailed(f"{scenario.name}: " + "\n  ".join(problems))
    ctx.log(f"  ok ({time.monotonic() - started:.1f}s)")
    return runs
