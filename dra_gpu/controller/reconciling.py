"""Keeps the driver's DeviceClasses applied: list, plan (pure), apply; on events and on a timer.

Three inputs wake the reconciler: a watch on DeviceClasses (someone deleted or edited one),
a change of the administrators' classes file (polled by stat, which also sees the symlink swap
of a mounted ConfigMap), and a periodic resync that repairs anything a lost watch event missed.
Each pass is a full list + :func:`classes.plan` + the planned calls, so a pass is idempotent
and a missed event costs at most one resync period.

Only the leader writes: every pass checks ``is_leader`` first; followers keep their watch and
file state warm so they act at once when they take over. A failing call is logged with the
server's message and retried on the next pass; it never stops the other classes' calls.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from dra_gpu.controller import classes
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient

log = logging.getLogger(__name__)

CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


class ClassSource:
    """The desired classes: built-ins plus the classes file, re-read when the file changes."""

    def __init__(self, *, path: Path | None, extended_resource_name: str | None) -> None:
        self._path = path
        self._ern = extended_resource_name
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self._desired: Sequence[classes.DesiredClass] = classes.builtin_classes(
            extended_resource_name=extended_resource_name
        )

    def desired(self) -> Sequence[classes.DesiredClass]:
        with self._lock:
            return self._desired

    def poll(self) -> bool:
        """Re-read the file if it changed; True when the desired classes changed."""
        if self._path is None:
            return False
        try:
            st = os.stat(self._path)
        except OSError as exc:
            if self._stamp != (0, 0, 0):
                log.error(
                    "classes file %s unreadable (%s); keeping the last good one", self._path, exc
                )
                self._stamp = (0, 0, 0)
            return False
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return self._load()

    def _load(self) -> bool:
        # pydantic, YAML and CEL parsing cost a controller without a classes file ~0.2 s of
        # start-up and ~18 MiB: imported only once there is a file to read.
        from dra_gpu.controller import classfile

        assert self._path is not None
        try:
            parsed = classfile.parse_classes_file(self._path.read_text(), source=str(self._path))
        except (OSError, UnicodeDecodeError, classfile.ClassesFileError) as exc:
            log.error("classes file not applied, keeping the last good one: %s", exc)
            return False
        for problem in parsed.problems:
            log.error("classes file: skipped %s", problem)
        for warning in parsed.warnings:
            log.warning("classes file: %s", warning)
        desired = classfile.desired_classes(flag_extended_resource_name=self._ern, file=parsed)
        with self._lock:
            changed = desired != self._desired
            self._desired = desired
        log.info("classes file %s loaded: %d class(es)", self._path, len(parsed.classes))
        return changed


class Reconciler:
    """Applies plans to the API server; remembers what the server accepted (see classes.plan)."""

    def __init__(self, client: KubeClient, source: ClassSource) -> None:
        self._client = client
        self._source = source
        self._accepted: dict[str, str] = {}
        self._reported_conflicts: set[str] = set()

    def reconcile_once(self) -> tuple[str, ...]:
        """One pass; the calls that failed (retried sooner than the resync)."""
        existing = self._client.request("GET", CLASSES_PATH).get("items") or []
        desired = self._source.desired()
        plan = classes.plan(desired, existing, accepted=self._accepted)
        for name in set(plan.conflicts) - self._reported_conflicts:
            log.warning(
                "DeviceClass %s exists without label %s=%s: left alone",
                name,
                classes.MANAGED_BY_LABEL,
                classes.MANAGED_BY_VALUE,
            )
        self._reported_conflicts = set(plan.conflicts)
        specs = {d.name: d.spec for d in desired}
        failures = []
        for step in plan.steps:
            try:
                self._apply(step, specs.get(step.name))
            except (errors.Conflict, errors.NotFound) as exc:
                # Changed under us since the list: the next pass sees the new state.
                log.info(
                    "DeviceClass %s %s raced (%s); retrying next pass",
                    step.name,
                    step.action.value,
                    exc.reason or exc.status,
                )
            except errors.ApiError as exc:
                failures.append(f"{step.action.value} {step.name}: {exc}")
                log.error(
                    "DeviceClass %s: %s failed: %s", step.name, step.action.value, exc.message
                )
        return tuple(failures)

    def _apply(self, step: classes.Step, spec: Any) -> None:
        path = f"{CLASSES_PATH}/{step.name}"
        if step.action is classes.Action.DELETE:
            body = {"preconditions": {"resourceVersion": step.resource_version}}
            self._client.request("DELETE", path, body=body)
            log.info("DeviceClass %s deleted: %s", step.name, step.reason)
            return
        assert step.body is not None
        if step.action is classes.Action.CREATE:
            stored = self._client.request("POST", CLASSES_PATH, body=step.body)
        else:
            stored = self._client.request("PUT", path, body=step.body)
        log.info("DeviceClass %s %sd: %s", step.name, step.action.value, step.reason)
        if spec is not None:
            want, got = classes.spec_key(spec), classes.spec_key(stored.get("spec") or {})
            if want != got:
                log.warning(
                    "DeviceClass %s: the server stored a different spec than sent "
                    "(fields this API server does not support?): %s",
                    step.name,
                    got,
                )
                self._accepted[want] = got


def watch_classes(client: KubeClient, stop: threading.Event, on_event: Callable[[], None]) -> None:
    """Call ``on_event`` for every DeviceClass change until ``stop``; restarts on any error."""
    failures = 0
    while not stop.is_set():
        try:
            listed = client.request("GET", CLASSES_PATH)
            failures = 0
            version = str(listed.get("metadata", {}).get("resourceVersion", ""))
            for event in client.watch(
                CLASSES_PATH,
                query={"resourceVersion": version, "allowWatchBookmarks": "true"},
                stop=stop,
                timeout_s=300,
            ):
                if event.get("type") != "BOOKMARK":
                    on_event()
        except errors.Gone:
            continue  # the resourceVersion expired: list again at once
        except Exception as exc:
            # Once per outage at INFO; the retries every 2 s only at DEBUG.
            failures += 1
            level = logging.INFO if failures == 1 else logging.DEBUG
            log.log(level, "DeviceClass watch interrupted (%s); restarting", exc)
            stop.wait(2.0)


class Reconciles(Protocol):
    def reconcile_once(self) -> tuple[str, ...]: ...


def run(
    reconciler: Reconciles,
    source: ClassSource,
    *,
    stop: threading.Event,
    wake: threading.Event,
    is_leader: Callable[[], bool],
    resync_s: float,
) -> None:
    """The reconcile loop: ``wake`` (set by the watch and by gaining leadership) or timers."""
    last_pass = float("-inf")
    retry_at = float("inf")
    while not stop.is_set():
        woken = wake.wait(1.0)
        wake.clear()
        if stop.is_set():
            return
        file_changed = source.poll()
        now = time.monotonic()
        due = woken or file_changed or now - last_pass >= resync_s or now >= retry_at
        if not due or not is_leader():
            continue
        last_pass, retry_at = now, float("inf")
        try:
            failed = bool(reconciler.reconcile_once())
        except errors.ApiError as exc:
            log.warning("listing DeviceClasses failed: %s", exc)
            failed = True
        if failed:
            retry_at = now + 5.0
        # Bound the rate if someone keeps fighting over a class.
        stop.wait(0.2)
