"""Thin Kubernetes API layer of the e2e suite (the only module of it that talks to a cluster).

Objects are plain dicts (as in the manifests), so the suite reads them like a user reads YAML.
Every wait polls with a deadline and fails with what it last saw, never hangs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config

from e2e import waiting
from e2e.kube_json import as_body, as_json
from e2e.waiting import WaitTimeout

T = TypeVar("T")
RESOURCE = ("resource.k8s.io", "v1")
__all__ = ["RESOURCE", "Kube", "WaitTimeout", "load_manifests", "wait_for"]


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float) -> T:
    """``e2e.waiting.wait_for`` for probes that read the API: an API error means "not yet" (an
    object the API server has not caught up on answers 404) and is reported on timeout."""
    return waiting.wait_for(what, probe, timeout=timeout, retry_on=(client.ApiException,))


def load_manifests(directory: Path) -> list[dict[str, Any]]:
    """All documents of ``directory/*.yaml``, files in name order (numbered like 01-claim.yaml)."""
    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _plural(kind: str) -> str:
    return kind.lower() + "s"


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    def from_kubeconfig(cls, path: Path | str | None) -> Kube:
        return cls(config.new_client_from_config(config_file=str(path) if path else None))

    def as_dict(self, obj: object) -> dict[str, Any]:
        result = self.api.sanitize_for_serialization(obj)
        assert isinstance(result, dict)
        return result

    # -- objects ---------------------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        self.core.create_namespace(
            as_body({"metadata": {"name": name, "labels": {"dra-gpu.test/e2e": "1"}}})
        )

    def delete_namespace(self, name: str, *, wait: float = 120.0) -> None:
        try:
            self.core.delete_namespace(name, grace_period_seconds=0)
        except client.ApiException as e:
            if e.status != 404:
                raise

        def gone() -> bool | None:
            try:
                self.core.read_namespace(name)
            except client.ApiException as e:
                if e.status == 404:
                    return True
                raise
            return None

        wait_for(f"namespace {name} to be deleted", gone, timeout=wait)

    def create(self, namespace: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        # The ServiceAccount admission plugin reads a cache that can lag behind a namespace's
        # fresh default ServiceAccount: retry that refusal (only that one) for a few seconds.
        deadline = time.monotonic() + 15
        while True:
            try:
                return self._create(namespace, doc)
            except client.ApiException as e:
                lagging = e.status == 403 and "service account" in str(e.body)
                if not lagging or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def _create(self, namespace: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        api_version, kind = str(doc["apiVersion"]), str(doc["kind"])
        if api_version == "v1" and kind == "Pod":
            return self.as_dict(self.core.create_namespaced_pod(namespace, as_body(doc)))
        group, version = api_version.split("/")
        return as_json(
            self.custom.create_namespaced_custom_object(
                group, version, namespace, _plural(kind), dict(doc)
            )
        )

    def delete_pods(self, namespace: str, names: Iterable[str], *, grace_s: int = 1) -> None:
        for name in names:
            try:
                self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_s)
            except client.ApiException as e:
                if e.status != 404:
                    raise

    # -- reads -----------------------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.as_dict(self.core.read_namespaced_pod(name, namespace))

    def pod_exists(self, namespace: str, name: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, namespace)
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def log(self, namespace: str, pod: str, container: str) -> str:
        return str(self.core.read_namespaced_pod_log(pod, namespace, container=container))

    def events(self, namespace: str, involved: str) -> list[dict[str, Any]]:
        found = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={involved}"
        )
        return [self.as_dict(e) for e in found.items]

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return as_json(
                self.custom.get_namespaced_custom_object(
                    *RESOURCE, namespace, "resourceclaims", name
                )
            )
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def slices(self) -> list[dict[str, Any]]:
        found = as_json(self.custom.list_cluster_custom_object(*RESOURCE, "resourceslices"))
        return list(found.get("items", []))

    def all_claims(self) -> list[dict[str, Any]]:
        found = as_json(self.custom.list_cluster_custom_object(*RESOURCE, "resourceclaims"))
        return list(found.get("items", []))
