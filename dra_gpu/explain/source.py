"""Reads what explain needs from the API server: the claim (from a pod, by name or a file),
DeviceClasses, ResourceSlices and every claim's allocation. Thin I/O only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml

from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.objects import (
    DeviceClass,
    DeviceClassSpec,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceSlice,
)

RESOURCE = "/apis/resource.k8s.io/v1"


class SourceError(Exception):
    """The object to explain cannot be found or read."""


def _items(client: KubeClient, path: str) -> list[Any]:
    items: list[Any] = client.request("GET", path).get("items") or []
    return items


def claims_of_pod(client: KubeClient, namespace: str, name: str) -> list[ResourceClaim]:
    """The pod's claims; one made from a template that does not exist yet is its template."""
    pod = client.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    generated = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    out: list[ResourceClaim] = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        claim_name = ref.get("resourceClaimName") or generated.get(ref["name"])
        if claim_name:
            out.append(claim(client, namespace, claim_name))
            continue
        template = client.request(
            "GET",
            f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/"
            f"{ref['resourceClaimTemplateName']}",
        )
        out.append(
            {
                "metadata": {"namespace": namespace, "name": f"{name}-{ref['name']} (template)"},
                # The template's JSON: its spec.spec taken to be a claim's spec, unchecked.
                "spec": cast(ResourceClaimSpec, (template.get("spec") or {}).get("spec") or {}),
            }
        )
    if not out:
        raise SourceError(f"pod {namespace}/{name} has no resourceClaims")
    return out


def claim(client: KubeClient, namespace: str, name: str) -> ResourceClaim:
    # The API boundary: the server's JSON is taken to be a ResourceClaim, unchecked.
    return cast(
        ResourceClaim,
        client.request("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"),
    )


def claims_in_file(path: Path, namespace: str) -> list[ResourceClaim]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, yaml.YAMLError) as err:
        raise SourceError(f"{path}: {err}") from err
    out: list[ResourceClaim] = []
    for doc in docs:
        if doc.get("kind") == "ResourceClaimTemplate":
            doc = {"metadata": doc.get("metadata") or {}, "spec": doc["spec"]["spec"]}
        elif doc.get("kind") != "ResourceClaim":
            continue
        doc.setdefault("metadata", {}).setdefault("namespace", namespace)
        out.append(cast(ResourceClaim, doc))  # the file's YAML, taken to be a claim, unchecked
    if not out:
        raise SourceError(f"{path}: no ResourceClaim or ResourceClaimTemplate in the file")
    return out


def cluster_state(
    client: KubeClient,
) -> tuple[dict[str, DeviceClassSpec], list[ResourceSlice], list[ResourceClaim]]:
    # The API boundary: the listed items are taken to be these objects, unchecked.
    device_classes = cast("list[DeviceClass]", _items(client, f"{RESOURCE}/deviceclasses"))
    classes = {c["metadata"]["name"]: c.get("spec") or {} for c in device_classes}
    return (
        classes,
        cast("list[ResourceSlice]", _items(client, f"{RESOURCE}/resourceslices")),
        cast("list[ResourceClaim]", _items(client, f"{RESOURCE}/resourceclaims")),
    )
