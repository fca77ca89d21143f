"""``make e2e-deployed``: the driver deployed as users deploy it, checked end to end.

``python -m e2e.deployed`` brings up ``e2e.deployed.env.DeployedEnv`` (image built with ``docker
build`` from the Dockerfile, a local control plane, two real kubelet + containerd nodes,
kube-proxy), then runs these checks in order and prints one line per check and a last line
``N passed, N failed``:

- ``install``: ``helm install`` of both releases with ``--wait``; meanwhile a GPU pod is created
  as soon as the API server admits its claim, and must run;
- ``plugins``: each node's plugin pod runs the chart's image, registered with its kubelet and
  published the node's ResourceSlices;
- ``controller``: the DeviceClasses exist and the controller holds its leader-election Lease;
- ``webhook``: an invalid ``GpuConfig`` is refused by the webhook, reached through its Service;
- ``policy``: the ValidatingAdmissionPolicy refuses a plugin's write of another node's slice;
- ``scenario <name>``: every scenario of ``python -m e2e.suite`` (``e2e.suite.scenarios``);
- ``broken canary``: with claims held on both pools, the canary pool (``ROLLOUT_ORDER[0]``) is
  upgraded to an image tag no node has; its gate fails, so the rollout stops there: the other
  pool keeps the old version and its claims, the canary's old plugin keeps serving (the rollout
  surges), and the canary is rolled back (not with ``--upgrade-from``: no pools then);
- ``upgrade``: with pods holding claims running (every full GPU of the canary among them),
  ``helm upgrade`` pool by pool to the second image tag, the canary first and the rest only once
  the canary passed its gate (``pool_gate``: plugin pods Ready on the new image and registered
  with the kubelet, the node's slices those ``dra-gpu discover`` predicts, a claim prepared
  there, and ``dra-gpu validate --node`` passing, its check claim with admin access since no
  device of its class is free, the Node then labelled ``gpu.nvidia.com/validated=<new tag>``);
  pods are created throughout the rollout; afterwards every plugin pod runs the new
  image, no pod got a ``FailedPrepareDynamicResources`` event, every pod created during the rollout
  ran, the claims prepared before it are unprepared by the new plugins when their pods go, and a
  pod created after it runs; the nodes' ``checkpoint.json`` still hold the claims prepared
  before it;
- ``uninstall``: ``helm uninstall`` removes the chart's objects; what stays (docs/user/install.md):
  the DeviceClasses the controller made and each node's checkpoint.

``--upgrade-from REF``: the upgrade from an earlier release. ``e2e-1`` is built from the tree of
the git ref REF and installed with that tree's chart and default values; ``upgrade`` goes to this
tree's chart and image (``e2e-2``). The scenarios are left out (they judge this tree's plugin, not
REF's); ``upgrade`` checks the same as without it, the claims REF's plugins prepared kept in
the nodes' checkpoints among them.

From 0.2.0 on, upgrades are supported from the previous release (CHANGELOG.md), and this is
their test: ``--upgrade-from <previous release commit>``. 0.2.0 is the first release, so the
default (no ``--upgrade-from``) builds both images from this tree; once there is a previous
release, the upgrade test's default starting point becomes that release's commit.

``Report.figures`` holds the timings ``bench/deployed.py`` prints.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client import ApiException

from dra_gpu import DRIVER_NAME
from dra_gpu.controller.classes import GPU_CLASS, MIG_CLASS
from dra_gpu.validate import steps as validate_steps
from e2e.cluster import ClusterError
from e2e.deployed import node_state
from e2e.deployed.env import (
    BROKEN_TAG,
    IMAGE_REPOSITORY,
    PROFILE_LABEL,
    REAL_NODE_SELECTOR,
    RELEASES,
    ROLLOUT_ORDER,
    TAGS,
    DeployedEnv,
    Release,
)
from e2e.images import node_images
from e2e.suite import runner
from e2e.suite.kube import RESOURCE, Kube, load_manifests, wait_for
from e2e.suite.scenarios import BY_NAME, SCENARIOS
from e2e.waiting import WaitTimeout

TIMEOUT_S = 180.0
OLD_POD_S = 60.0  # an old plugin pod's termination after helm --wait returned
FAILED_PREPARE = "FailedPrepareDynamicResources"
PROBES_HELD = 4
GATE_S = 120.0  # a pool's plugin pods Ready on the new image within this, or the gate fails
BROKEN_GATE_S = 45.0  # how long the broken canary is given (it never becomes Ready)
VALIDATED_LABEL = validate_steps.validated_label(DRIVER_NAME)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Report:
    results: list[tuple[str, str]] = field(default_factory=list)  # (check, "" or problem)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(1 for _, problem in self.results if problem)

    @property
    def passed(self) -> int:
        return len(self.results) - self.failed


class Checks:
    def __init__(self, env: DeployedEnv, report: Report, log: Callable[[str], None]) -> None:
        self.env, self.report, self.log = env, report, log
        # Node -> (full GPUs workloads held, full GPUs) when validate last started there.
        self.held_when_validated: dict[str, tuple[int, int]] = {}
        self.kube = Kube(env.cluster.api_client())
        cdi = tuple(node.cdi_root for node in env.nodes.values())
        self.ctx = runner.Context(
            kube=self.kube,
            cdi_dirs=cdi,
            timeout=TIMEOUT_S,
            node_selector=REAL_NODE_SELECTOR,
            log=log,
        )

    def check(self, name: str, body: Callable[[], list[str]]) -> bool:
        started = time.monotonic()
        try:
            problems = body()
        except Exception as exc:
            problems = [f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"]
        took = time.monotonic() - started
        problem = "\n    ".join(problems)
        self.report.results.append((name, problem))
        print(f"[{'ok' if not problem else 'FAILED'}] {name} ({took:.1f}s)", flush=True)
        if problem:
            print(f"    {problem}", flush=True)
        return not problem

    # ----- helpers ------------------------------------------------------------------------

    def plugin_pods(self, release: Release) -> list[dict[str, Any]]:
        selector = (
            f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=kubelet-plugin"
        )
        found = self.kube.core.list_namespaced_pod(release.name, label_selector=selector)
        return [self.kube.as_dict(p) for p in found.items]

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.kube.slices() if s["spec"].get("nodeName") == node]

    def no_slices(self, node: str) -> bool:
        return not self.node_slices(node)

    def no_plugin_pods(self, release: Release) -> bool:
        return not self.plugin_pods(release)

    def registration_sockets(self, node: str) -> list[Path]:
        registry = self.env.nodes[node].paths.plugin_registry_dir
        return list(registry.glob("gpu.nvidia.com-*-reg.sock"))

    def on_pool(self, release: Release) -> runner.Context:
        """The scenario context with pods kept on ``release``'s node (its pool)."""
        selector = {**REAL_NODE_SELECTOR, PROFILE_LABEL: release.profile}
        return dataclasses.replace(self.ctx, node_selector=selector)

    def start_running(self, scenario: str, ctx: runner.Context | None = None) -> runner.Run:
        """``runner.start`` of a scenario, retried while the API server cannot reach the
        webhook yet (the chart's first seconds); its problems fail the caller."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                run, problems = runner.start(ctx or self.ctx, BY_NAME[scenario])
            except ApiException as exc:
                if exc.status != 500 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                continue
            if problems:
                raise AssertionError("; ".join(problems))
            return run

    # ----- pool by pool ----------------------------------------------------------------------

    def predicted_slices(self, release: Release) -> list[dict[str, Any]]:
        """What ``dra-gpu discover`` says a node of the pool's profile publishes."""
        argv = [sys.executable, "-m", "dra_gpu", "discover", "--simulate", release.profile]
        argv += ["--node", release.node, "-o", "json"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def pool_gate(self, release: Release, tag: str, *, timeout: float = GATE_S) -> list[str]:
        """Whether ``release``'s pool is ready on image ``tag``: its plugin pods all on it and
        Ready, one of them registered with the kubelet, the node's slices those ``dra-gpu
        discover`` predicts for the pool, a claim prepared there (a pod with one runs and sees
        its device, then its claim is unprepared), and ``dra-gpu validate --node`` passing, as
        a platform team's rollout would gate on it (its node label then names ``tag``).
        Problems, or none."""
        image = f"{IMAGE_REPOSITORY}:{tag}"

        def ready(pod: dict[str, Any]) -> bool:
            conditions = (pod.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        def rolled() -> tuple[list[dict[str, Any]]] | None:
            pods = self.plugin_pods(release)
            on_tag = all(p["spec"]["containers"][0]["image"] == image for p in pods)
            return (pods,) if pods and on_tag and all(map(ready, pods)) else None

        try:
            (pods,) = wait_for(
                f"{release.pool}: plugin pods Ready on {image}", rolled, timeout=timeout
            )
        except WaitTimeout:
            states = [
                (p["spec"]["containers"][0]["image"], ready(p), p["status"].get("phase"))
                for p in self.plugin_pods(release)
            ]
            return [
                f"pool {release.pool}: plugin pods not all Ready on {image} in {timeout:.0f} s "
                f"(image, ready, phase: {states})"
            ]
        problems = []
        uids = {p["metadata"]["uid"] for p in pods}
        sockets = [s.name for s in self.registration_sockets(release.node)]
        if not any(uid in name for uid in uids for name in sockets):
            problems.append(f"pool {release.pool}: no new plugin registered ({sockets})")

        def spec(obj: dict[str, Any]) -> tuple[str, str]:
            body = dict(obj["spec"])
            body["pool"] = {k: v for k, v in body["pool"].items() if k != "generation"}
            return obj["metadata"]["name"], json.dumps(body, sort_keys=True)

        published = sorted(map(spec, self.node_slices(release.node)))
        if published != sorted(map(spec, self.predicted_slices(release))):
            problems.append(f"pool {release.pool}: {release.node}'s slices are not discover's")
        try:
            run = self.start_running(release.scenario, self.on_pool(release))
            problems += runner.finish(self.ctx, run)
        except Exception as exc:
            problems.append(f"pool {release.pool}: a claim was not prepared there: {exc}")
        return problems + self.validate(release, tag)

    def validate(self, release: Release, tag: str) -> list[str]:
        """``dra-gpu validate --node`` for the pool's node, as the chart's validation Job runs
        it: every check must pass, its check claim with admin access (the release namespace
        carries the label), and the Node must then carry ``gpu.nvidia.com/validated=<tag>``
        (the plugin image's tag). Its report goes to the log, with how many of the node's full
        GPUs workloads held when it started (``held_when_validated``)."""
        held, gpus = self.held_gpus(release.node)
        self.held_when_validated[release.node] = (len(held), len(gpus))
        self.log(
            f"[validate] {release.node}: full GPUs held by workloads: {len(held)} of {len(gpus)} "
            f"({', '.join(sorted(held)) or '-'})"
        )
        node = self.env.nodes[release.node]
        argv = [sys.executable, "-m", "dra_gpu", "validate", "--node", release.node]
        argv += ["--kubeconfig", str(self.env.kubeconfig()), "--cdi-root", str(node.cdi_root)]
        argv += ["--image", node_images.TEST_IMAGE, "--timeout", f"{TIMEOUT_S:g}"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=6 * TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return [f"pool {release.pool}: dra-gpu validate --node {release.node} did not end"]
        for line in done.stdout.splitlines():
            self.log(f"[validate] {line}")
        if done.returncode != 0:
            failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
            why = "; ".join(failed) or done.stderr.strip()[-500:]
            return [f"pool {release.pool}: dra-gpu validate --node {release.node} failed: {why}"]
        pod_line = next((x for x in done.stdout.splitlines() if x.startswith("PASS  pod")), "")
        if not pod_line.endswith(validate_steps.claim_access(None)):
            return [f"pool {release.pool}: validate's check claim had no admin access: {pod_line}"]
        labels = self.kube.as_dict(self.kube.core.read_node(release.node))["metadata"]["labels"]
        recorded = labels.get(VALIDATED_LABEL)
        if recorded != tag:
            return [f"pool {release.pool}: {release.node} labelled {VALIDATED_LABEL}={recorded}"]
        return []

    def held_gpus(self, node: str) -> tuple[set[str], set[str]]:
        """(the node's full GPUs that workloads' claims hold, all its full GPUs)."""
        gpus = {
            d["name"]
            for s in self.node_slices(node)
            for d in s["spec"].get("devices") or []
            if ((d.get("attributes") or {}).get("type") or {}).get("string") == "gpu"
        }
        held = set()
        for claim in self.kube.all_claims():
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for r in (allocation.get("devices") or {}).get("results") or []:
                if r.get("pool") == node and r["device"] in gpus and not r.get("adminAccess"):
                    held.add(r["device"])
        return held, gpus

    def rollout(
        self, tag: str, *, canary_tag: str | None = None
    ) -> tuple[list[str], list[Release]]:
        """``helm upgrade`` pool by pool (``ROLLOUT_ORDER``), each pool's gate before the next;
        the first gate that fails stops the rollout. ``canary_tag``: the canary pool's image
        (no ``--wait``: the gate judges it). Returns the gate's problems and the releases
        upgraded."""
        upgraded: list[Release] = []
        for number, release in enumerate(ROLLOUT_ORDER):
            pool_tag = canary_tag if number == 0 else None
            self.env.upgrade(release, tag, pool_tag=pool_tag, wait=pool_tag is None)
            upgraded.append(release)
            timeout = GATE_S if pool_tag is None else BROKEN_GATE_S
            gate = self.pool_gate(release, pool_tag or tag, timeout=timeout)
            # A gate's problems name their pool.
            self.log("[rollout] " + ("; ".join(gate) or f"pool {release.pool}: passed its gate"))
            if gate:
                return gate, upgraded
        return [], upgraded

    def plugin_images(self, release: Release) -> set[str]:
        return {p["spec"]["containers"][0]["image"] for p in self.plugin_pods(release)}

    # ----- the checks ---------------------------------------------------------------------

    def install(self) -> list[str]:
        first, rest = RELEASES[0], RELEASES[1:]
        started = time.monotonic()
        seen: dict[str, float] = {}
        done = threading.Event()

        def watch() -> None:  # plugin pod created -> its node's slices published
            while not done.wait(0.2):
                for release in RELEASES:
                    if f"pod {release.node}" not in seen and self.plugin_pods(release):
                        seen[f"pod {release.node}"] = time.monotonic()
                    if f"slices {release.node}" not in seen and self.node_slices(release.node):
                        seen[f"slices {release.node}"] = time.monotonic()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        errors: list[str] = []

        def helm_install(release: Release) -> None:
            try:
                self.log(self.env.install(release, TAGS[0]))
            except Exception as exc:
                errors.append(str(exc))

        installs = [threading.Thread(target=helm_install, args=(first,))]
        installs[0].start()
        try:
            run = self.start_running("one-gpu")
            self.report.figures["chart install -> first GPU pod Running (s)"] = (
                time.monotonic() - started
            )
            problems = runner.finish(self.ctx, run)
        finally:
            installs[0].join()
        for release in rest:
            helm_install(release)
        done.set()
        watcher.join()
        for release in RELEASES:
            pod_seen, slices_seen = (
                seen.get(f"pod {release.node}"),
                seen.get(f"slices {release.node}"),
            )
            if pod_seen is not None and slices_seen is not None:
                key = f"plugin pod created -> slices published, {release.node} (s)"
                self.report.figures[key] = max(0.0, slices_seen - pod_seen)
        return errors + problems

    def plugins(self) -> list[str]:
        problems = []
        for release in RELEASES:
            pods = self.plugin_pods(release)
            if len(pods) != 1:
                problems.append(f"{release.name}: {len(pods)} plugin pods, wanted 1")
                continue
            pod = pods[0]
            if pod["spec"].get("nodeName") != release.node:
                problems.append(f"{release.name}: plugin on {pod['spec'].get('nodeName')}")
            image = pod["spec"]["containers"][0]["image"]
            if image != f"dra-gpu:{TAGS[0]}":
                problems.append(f"{release.name}: plugin image {image}")
            if not self.registration_sockets(release.node):
                problems.append(f"{release.node}: no registration socket in the kubelet's dir")
            if not self.node_slices(release.node):
                problems.append(f"{release.node}: no ResourceSlices")
        return problems

    def controller(self) -> list[str]:
        group, version = RESOURCE
        for name in (GPU_CLASS, MIG_CLASS):
            self.kube.custom.get_cluster_custom_object(group, version, "deviceclasses", name)
        from kubernetes.client import CoordinationV1Api

        lease = CoordinationV1Api(self.kube.api).read_namespaced_lease(
            "dra-gpu-controller", RELEASES[0].name
        )
        holder = (lease.spec.holder_identity if lease.spec else None) or ""
        if not holder.startswith("dra-gpu-controller-"):
            return [f"the Lease is held by {holder!r}, not a controller pod"]
        return []

    def webhook(self) -> list[str]:
        namespace = "e2e-webhook"
        self.kube.create_namespace(namespace)
        try:
            for doc in load_manifests(self.ctx.scenarios_dir / "invalid-config"):
                if doc["kind"] == "Pod":
                    continue
                try:
                    self.kube.create(namespace, doc)
                except ApiException as exc:
                    body = str(exc.body)
                    if "admission webhook" in body and "mpsConfig" in body:
                        return []
                    return [f"refused, but not by the webhook: {body}"]
                return ["an invalid GpuConfig was admitted"]
            return ["the scenario has no claim"]
        finally:
            self.kube.delete_namespace(namespace)

    def policy(self) -> list[str]:
        """A write as the h200 node's plugin (its service account, a token bound to gpu-h200)
        of a slice for gpu-a100 must be refused by the policy."""
        h200, a100 = RELEASES[0], RELEASES[1]
        sa = f"system:serviceaccount:{h200.name}:{h200.name}-kubelet-plugin"
        slice_doc = (
            '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",'
            '"metadata":{"name":"e2e-foreign"},"spec":{"driver":"gpu.nvidia.com",'
            f'"nodeName":"{a100.node}","pool":{{"name":"{a100.node}","generation":1,'
            '"resourceSliceCount":1},"devices":[]}}'
        )
        try:
            made = self.env.cluster.kubectl(
                *("create", "-f", "-", f"--as={sa}", "--as-group=system:serviceaccounts"),
                f"--as-user-extra=authentication.kubernetes.io/node-name={h200.node}",
                input=slice_doc,
            )
        except ClusterError as exc:
            if "may only write ResourceSlices of its own node" in str(exc):
                return []
            return [f"refused, but not by the policy: {exc}"]
        self.env.cluster.kubectl("delete", "resourceslice", "e2e-foreign", check=False)
        return [f"a foreign slice was created: {made}"]

    def scenario(self, name: str) -> list[str]:
        try:
            runner.run_scenario(self.ctx, BY_NAME[name])
        except runner.ScenarioFailed as exc:
            return [str(exc)]
        return []

    def held_claims(self, runs: list[runner.Run]) -> dict[str, set[str]]:
        """Node -> UIDs of the claims ``runs`` hold there (their pods' node)."""
        held: dict[str, set[str]] = {}
        for run in runs:
            nodes = {pod["spec"].get("nodeName") or "" for pod in run.pods.values()}
            for node in nodes:
                uids = {claim["metadata"]["uid"] for claim in run.claims.values()}
                held.setdefault(node, set()).update(uids)
        return held

    def broken_canary(self) -> list[str]:
        """A canary on an image no node has fails its gate and stops the rollout: the rest
        keep the old version and their claims; the canary's old plugin keeps serving."""
        canary, rest = ROLLOUT_ORDER[0], ROLLOUT_ORDER[1:]
        holding = [self.start_running(r.scenario, self.on_pool(r)) for r in ROLLOUT_ORDER]
        held = self.held_claims(holding)
        old = f"{IMAGE_REPOSITORY}:{TAGS[0]}"
        problems: list[str] = []
        gate, upgraded = self.rollout(TAGS[1], canary_tag=BROKEN_TAG)
        if not gate:
            problems.append(f"the canary on {BROKEN_TAG} passed its gate")
        if upgraded != [canary]:
            problems.append(f"the rollout went on past the canary: {[r.pool for r in upgraded]}")
        for release in rest:
            if self.plugin_images(release) != {old}:
                problems.append(f"pool {release.pool}: images {self.plugin_images(release)}")
        # The canary's node still has its old plugin: the broken pod surged next to it.
        if old not in self.plugin_images(canary):
            problems.append(f"pool {canary.pool}: no old plugin left {self.plugin_images(canary)}")
        problems += self._checkpoints_kept(held)
        self.env.upgrade(canary, TAGS[0])  # roll the canary back (--wait)
        for release in ROLLOUT_ORDER:
            gate = self.pool_gate(release, TAGS[0])
            problems += [f"after the rollback: {p}" for p in gate]
        for run in holding:  # the old plugins unprepare what they prepared
            problems += runner.finish(self.ctx, run)
        return problems

    def upgrade(self) -> list[str]:
        canary = ROLLOUT_ORDER[0]
        # Every full GPU of the canary held (a100x4-mig has one, gpu-0; the rest are MIG
        # devices), so the canary's gate validates a node with no device of its class free.
        holding = [
            self.start_running("one-gpu", self.on_pool(canary)),
            self.start_running("one-gpu"),
            self.start_running("mig-by-profile"),
        ]
        held = self.held_claims(holding)
        failed_prepares: list[str] = []
        stop = threading.Event()

        def watch_events() -> None:
            while not stop.wait(0.5):
                found = self.kube.core.list_event_for_all_namespaces(
                    field_selector=f"reason={FAILED_PREPARE}"
                )
                for event in found.items:
                    text = (
                        f"{event.metadata.namespace}/{event.involved_object.name}: {event.message}"
                    )
                    if text not in failed_prepares:
                        failed_prepares.append(text)

        during: list[tuple[float, str]] = []  # (create -> Running seconds, problem or "")
        live: list[runner.Run] = []  # started during the rollout, finished after it

        def probe_pods() -> None:
            # One new GPU pod after another while the rollout goes on; at most PROBES_HELD keep
            # their GPU (the oldest is deleted first), so the node never runs out of them.
            while not stop.is_set():
                if len(live) >= PROBES_HELD:
                    problems = runner.finish(self.ctx, live.pop(0))
                    during.extend((0.0, p) for p in problems)
                started = time.monotonic()
                try:
                    live.append(self.start_running("one-gpu"))
                    during.append((time.monotonic() - started, ""))
                except Exception as exc:
                    during.append((time.monotonic() - started, str(exc)))

        unregistered: dict[str, float] = {r.node: 0.0 for r in RELEASES}

        def watch_registration() -> None:
            # The kubelet can prepare only through a registered plugin: time with no
            # registration socket in a node's registry directory is time prepare would fail.
            last = time.monotonic()
            while not stop.wait(0.05):
                now = time.monotonic()
                for node, seconds in unregistered.items():
                    if not self.registration_sockets(node):
                        unregistered[node] = seconds + (now - last)
                last = now

        watcher = threading.Thread(target=watch_events, daemon=True)
        prober = threading.Thread(target=probe_pods, daemon=True)
        registration = threading.Thread(target=watch_registration, daemon=True)
        registration.start()
        old_pods = {r.name: {p["metadata"]["name"] for p in self.plugin_pods(r)} for r in RELEASES}
        watcher.start()
        prober.start()
        started = time.monotonic()
        problems: list[str] = []
        try:
            if self.env.pools:  # pool by pool, the canary first, each through its gate
                gate, _ = self.rollout(TAGS[1])
                problems += gate
                self.report.figures["upgrade pool by pool, each gated (s)"] = (
                    time.monotonic() - started
                )
            else:
                for release in RELEASES:
                    self.env.upgrade(release, TAGS[1])
                self.report.figures["helm upgrade, both releases, --wait (s)"] = (
                    time.monotonic() - started
                )
        finally:
            stop.set()
            prober.join(timeout=TIMEOUT_S * 2)
            registration.join()
        for node, seconds in unregistered.items():
            self.report.figures[f"no plugin registered during the upgrade, {node} (s)"] = seconds
            if seconds:
                problems.append(f"{node}: no plugin registered for {seconds:.2f} s")
        returned = time.monotonic()
        for release in RELEASES:
            # helm --wait returns once the new pods are ready; with maxSurge the old ones are
            # deleted only then, so they may still be terminating: they must go, soon.
            def replaced(r: Release = release) -> tuple[list[dict[str, Any]]] | None:
                pods = self.plugin_pods(r)
                gone = not {p["metadata"]["name"] for p in pods} & old_pods[r.name]
                return (pods,) if gone else None

            try:
                (pods,) = wait_for(
                    f"{release.name}: the old plugin pods gone", replaced, timeout=OLD_POD_S
                )
            except WaitTimeout:
                problems.append(f"{release.name}: an old plugin pod is still there")
                pods = self.plugin_pods(release)
            self.report.figures[f"{release.name}: old plugin pods gone after helm (s)"] = (
                time.monotonic() - returned
            )
            images = {p["spec"]["containers"][0]["image"] for p in pods}
            if images != {f"dra-gpu:{TAGS[1]}"}:
                problems.append(f"{release.name}: plugin images after the upgrade {images}")
        problems += self._checkpoints_kept(held)
        if self.env.pools:
            busy, gpus = self.held_when_validated.get(canary.node, (0, 0))
            self.report.figures[f"full GPUs of the canary held when validated ({gpus})"] = busy
            if not gpus or busy < gpus:
                problems.append(f"the canary was validated with {busy} of {gpus} full GPUs held")
        for run in [*holding, *live]:
            problems += runner.finish(self.ctx, run)
        problems += self._unprepared_by_new(holding)
        after = self.start_running("one-gpu")
        problems += runner.finish(self.ctx, after)
        time.sleep(1.0)  # the event watcher's last poll
        watcher.join(timeout=0)
        self.report.figures["pods started during the upgrade"] = float(
            sum(1 for t, _ in during if t)
        )
        if during:
            self.report.figures["slowest create -> Running during the upgrade (s)"] = max(
                t for t, _ in during
            )
        self.report.figures["FailedPrepareDynamicResources events during the upgrade"] = float(
            len(failed_prepares)
        )
        problems += [f"pod during the rollout: {p}" for _, p in during if p]
        if not during:
            problems.append("no pod was started during the rollout")
        problems += [f"{FAILED_PREPARE}: {text}" for text in failed_prepares]
        return problems

    def _checkpoints_kept(self, held: dict[str, set[str]]) -> list[str]:
        """Once only the new plugins run: each node's checkpoint.json holds the claims prepared
        before the upgrade."""
        files = {node: node_state.read_checkpoint(self.env.state_dir(node)) for node in held}
        return node_state.missing_claims(held, files)

    def _unprepared_by_new(self, runs: list[runner.Run]) -> list[str]:
        """Each claim's unprepare is in the log of a plugin pod of the new version."""
        logs = ""
        for release in RELEASES:
            for pod in self.plugin_pods(release):
                logs += self.kube.log(release.name, pod["metadata"]["name"], "plugin")
        unprepared = [line for line in logs.splitlines() if "unprepared" in line]
        problems = []
        for run in runs:
            for name, claim in run.claims.items():
                uid = claim["metadata"]["uid"]
                if not any(uid in line for line in unprepared):
                    problems.append(f"claim {name} ({uid}): no new plugin logged its unprepare")
        return problems

    def uninstall(self) -> list[str]:
        for release in RELEASES:
            self.log(self.env.uninstall(release))
        problems = []
        for release in RELEASES:
            left = self.env.cluster.kubectl(
                *("get", "daemonsets,deployments,services,serviceaccounts,roles,rolebindings"),
                *("-n", release.name, "-l", f"app.kubernetes.io/instance={release.name}"),
                "-o",
                "name",
            ).split()
            if left:
                problems.append(f"{release.name}: left after uninstall: {left}")
            if self.plugin_pods(release):
                wait_for(
                    f"{release.name} plugin pods gone",
                    functools.partial(self.no_plugin_pods, release),
                    timeout=TIMEOUT_S,
                )
        cluster_left = self.env.cluster.kubectl(
            "get",
            "clusterroles,clusterrolebindings,validatingwebhookconfigurations,"
            "validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-l",
            "app.kubernetes.io/name=dra-gpu",
            "-o",
            "name",
        ).split()
        if cluster_left:
            problems.append(f"cluster-scoped objects left: {cluster_left}")
        group, version = RESOURCE
        for name in (GPU_CLASS, MIG_CLASS):  # documented to stay
            self.kube.custom.get_cluster_custom_object(group, version, "deviceclasses", name)
        for release in RELEASES:  # the kubelet deletes the slices once no plugin comes back
            try:
                wait_for(
                    f"the kubelet to delete the ResourceSlices of {release.node}",
                    functools.partial(self.no_slices, release.node),
                    timeout=TIMEOUT_S,
                )
            except AssertionError as exc:
                problems.append(str(exc))
        for release in RELEASES:  # documented to stay: the checkpoint
            data = self.env.nodes[release.node].paths.plugins_dir / "gpu.nvidia.com"
            if not any(data.glob("*checkpoint*")):
                problems.append(f"{release.node}: no checkpoint in {data}: {list(data.iterdir())}")
        return problems


def run(env: DeployedEnv, report: Report, *, log: Callable[[str], None] = _stderr) -> Report:
    checks = Checks(env, report, log)
    if not checks.check("install", checks.install):
        return report
    for name, body in (
        ("plugins", checks.plugins),
        ("controller", checks.controller),
        ("webhook", checks.webhook),
        ("policy", checks.policy),
    ):
        checks.check(name, body)
    if env.upgrade_from is None:
        for scenario in SCENARIOS:
            name = scenario.name
            checks.check(f"scenario {name}", functools.partial(checks.scenario, name))
    if env.pools:
        checks.check("broken canary", checks.broken_canary)
    checks.check("upgrade", checks.upgrade)
    checks.check("uninstall", checks.uninstall)
    return report


@contextlib.contextmanager
def deployed(env: DeployedEnv, report: Report) -> Iterator[DeployedEnv]:
    """``env`` up, with its images' sizes in ``report``; down again on the way out, its work
    directory removed when every check passed, else kept for its logs."""
    passed = False
    try:
        env.up()
        for tag, image in env.images.items():
            report.figures[f"image dra-gpu:{tag} size (MiB)"] = image.size_bytes / 2**20
        yield env
        passed = not report.failed
    finally:
        env.down()
        if passed:
            shutil.rmtree(env.workdir, ignore_errors=True)
        else:
            print(f"logs kept in {env.workdir}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.deployed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--upgrade-from",
        metavar="REF",
        help="build the first image from this git ref (a commit, tag or branch of the "
        "repository) and install it with that ref's chart; the upgrade goes to this tree. "
        "Default: both images from this tree (0.2.0 is the first release); once there is a "
        "previous release, pass its commit",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    report = Report()
    env = DeployedEnv(upgrade_from=args.upgrade_from)
    try:
        with deployed(env, report):
            run(env, report)
    except Exception as exc:  # the environment failed: that is one failed check
        traceback.print_exc()
        report.results.append(("environment", str(exc)))
    for key, value in report.figures.items():
        print(f"  {key}: {value:.1f}")
    print(f"took {time.monotonic() - started:.0f} s")
    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed or not report.results else 0


if __name__ == "__main__":
    raise SystemExit(main())
