"""The Helm chart and the plain manifests, against a real API server.

Cases:
- the committed plain manifests (``manifests/rendered/``) are exactly what the chart renders;
- ``kubeletPlugin.migMode=dynamic`` starts the plugin in dynamic MIG mode; static renders
  nothing (the plugin's default), and another value fails the render; so does
  ``kubeletPlugin.sharing.consumableShares`` (memory, an integer; disabled renders nothing);
- every object the chart renders is accepted by the API server (server-side dry-run), for the
  default values, simulated GPUs, and both ways of getting the webhook certificate;
- the ValidatingAdmissionPolicies: a token of the plugin's ServiceAccount bound to node A may
  create, update and delete node A's ResourceSlice of its driver and is refused node B's
  (create, update, delete, and moving a slice from A to B) and another driver's slice on node A
  (create, update, delete); a token bound to no node writes nothing; of Events about Nodes it
  may post those about Node A in ``default`` only (not node B, not in another namespace, not
  with node B as source host);
- Events about pods and claims: RBAC grants Events in every namespace always; the policy
  ``claim-events`` admits PrepareFailed always and GpuIdle exactly when the plugin posts it (as
  it reads the values it is given). With idle-claim Events off, the PrepareFailed Warnings the
  prepare wrapper posts about a claim and its pod in a user's namespace are stored, and GpuIdle
  or another reason is refused. With them on (a second release), the plugin's own GpuIdle
  Warning about a pod or a claim is admitted (and stored when posted the way the loop posts
  it), and refused with another reason or type, another or no node as reporter, a related
  object, a Secret as subject, or from a token bound to no node;
- the plugin's RBAC: it may get a claim by name, not list or watch claims (in a namespace or
  cluster-wide); it may write its own driver's ``status.devices`` entries of a claim allocated
  on its node, not another driver's (from 1.36 the API server checks ``resourceclaims/driver``,
  which the chart grants only where the server asks for it), nor the claim's allocation or
  reservedFor (the ValidatingAdmissionPolicy ``own-device-status``, on every version);
- the controller's policy: its token may create a DeviceClass labelled as its own, and may not
  create an unlabelled one, nor delete or take over (label) another's;
- the plugin's RBAC is enough for the real kubelet plugin: run with a node-bound token of its
  ServiceAccount, it publishes its node's devices;
- node labels (``kubeletPlugin.nodeLabels``, on by default): a token bound to node A may patch
  node A's ``nvidia.com/`` labels; the API server refuses, with the policy's message, node B's
  labels, a label key outside ``nvidia.com/``, node A's spec, and any label from a token bound
  to no node. The real plugin with the chart's identity writes GFD's labels on its node, equal
  to its slices (product, GPU count, memory), follows a re-discovery (fewer GPUs, another
  driver version), and ``dra-gpu remove-node-labels`` takes exactly its labels off again.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.plugin import settings as plugin_settings
from e2e import helm, waiting
from e2e.cluster import Cluster
from e2e.kube_json import as_body

DRIVER = "gpu.nvidia.com"
POLICY_NS = "dra-gpu-policy"
PLUGIN_SA = "dra-gpu-kubelet-plugin"
CONTROLLER_SA = "dra-gpu-controller"
WAIT_S = 60.0
MERGE_PATCH = "application/merge-patch+json"
wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S, every=0.5)  # probes run kubectl

# Schema-less stand-ins for the CRDs of cert-manager and the Prometheus Operator, whose objects
# the chart renders on request.
CERT_MANAGER_CRDS: list[dict[str, Any]] = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    for group, kind, plural in (
        ("cert-manager.io", "Certificate", "certificates"),
        ("cert-manager.io", "Issuer", "issuers"),
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    )
]


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_committed_plain_manifests_match_the_chart() -> None:
    for path, text in helm.render_committed().items():
        assert path.is_file(), f"{path} is missing: run python -m e2e.helm render"
        assert path.read_text() == text, f"{path} is stale: run python -m e2e.helm render"


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set", "simulate.enabled=true,webhook.enabled=true,webhook.certManager.enabled=true"],
        [
            "--set",
            "metrics.enabled=true,metrics.serviceMonitor.enabled=true,"
            "metrics.grafanaDashboard.enabled=true,metrics.prometheusRule.enabled=true",
        ],
        [
            "--set",
            "kubeletPlugin.pools[0].name=canary,kubeletPlugin.pools[0].nodeSelector.pool=canary,"
            "kubeletPlugin.pools[0].image.tag=2,kubeletPlugin.pools[0].migMode=dynamic,"
            "kubeletPlugin.pools[1].name=rest,kubeletPlugin.pools[1].nodeSelector.pool=rest",
        ],
    ],
    ids=["defaults", "simulated-webhook", "metrics", "pools"],
)
def test_chart_passes_helm_lint(values: list[str]) -> None:
    proc = subprocess.run(
        [str(helm.ensure_helm()), "lint", "--strict", str(helm.CHART), *values],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> str:
    cluster.create_namespace("dra-gpu")
    return "dra-gpu"


@pytest.fixture(scope="module")
def cert_manager_crds(cluster: Cluster) -> None:
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": CERT_MANAGER_CRDS}),
    )
    for crd in CERT_MANAGER_CRDS:
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}"
        )


VARIANTS: dict[str, dict[str, str | bool | int]] = {
    "defaults": {},
    "simulated": {"simulate.enabled": True},
    "webhook-secret": {
        "webhook.enabled": True,
        "webhook.tls.caBundle": base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode(),
        "controller.deviceClasses.classes[0].name": "h200.nvidia.com",
        "controller.deviceClasses.classes[0].productName": "NVIDIA H200",
        "controller.extendedResourceName": "nvidia.com/gpu",
        "kubeletPlugin.stateDir": "/var/lib/dra-gpu",
        "kubeletPlugin.driverRoot": "/run/nvidia/driver",
    },
    "webhook-cert-manager": {"webhook.enabled": True, "webhook.certManager.enabled": True},
    "metrics": {
        "metrics.enabled": True,
        "metrics.serviceMonitor.enabled": True,
        "metrics.grafanaDashboard.enabled": True,
        "metrics.prometheusRule.enabled": True,
        "webhook.enabled": True,
        "webhook.certManager.enabled": True,
    },
    # validate as a post-install/upgrade Job; node labels off (no patch, no label policy, no hook)
    "validation-no-labels": {
        "validation.enabled": True,
        "validation.nodes[0]": "gpu-node-1",
        "kubeletPlugin.nodeLabels.enabled": False,
    },
    "pools": {
        "metrics.enabled": True,
        "kubeletPlugin.pools[0].name": "canary",
        "kubeletPlugin.pools[0].nodeSelector.pool": "canary",
        "kubeletPlugin.pools[0].image.tag": "2",
        "kubeletPlugin.pools[0].migMode": "dynamic",
        "kubeletPlugin.pools[0].sharing.consumableShares": "memory",
        "kubeletPlugin.pools[1].name": "h200",
        "kubeletPlugin.pools[1].nodeSelector.pool": "h200",
        "kubeletPlugin.pools[1].tolerations[0].operator": "Exists",
    },
}


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_api_server_accepts_every_rendered_object(
    cluster: Cluster, namespace: str, cert_manager_crds: None, values: dict[str, Any]
) -> None:
    rendered = helm.render(namespace=namespace, set_values={"namespace.create": True, **values})
    kinds = {doc["kind"] for doc in _docs(rendered)}
    assert {"DaemonSet", "Deployment", "ValidatingAdmissionPolicy"} <= kinds
    applied = cluster.server_dry_run(rendered, field_manager="dra-gpu-test")
    assert len(applied) == len(_docs(rendered)), applied


def yaml_blocks(markdown: str) -> list[dict[str, Any]]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def test_every_example_in_the_docs_is_accepted(cluster: Cluster, namespace: str) -> None:
    docs = yaml_blocks((helm.CHART.parents[2] / "docs" / "user" / "examples.md").read_text())
    assert len(docs) >= 8
    for doc in docs:
        cluster.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(doc)
        )


def test_webhook_without_a_certificate_source_does_not_render() -> None:
    with pytest.raises(RuntimeError, match="caBundle"):
        helm.render(set_values={"webhook.enabled": True})


def _plugin_env(values: dict[str, str | bool | int]) -> dict[str, str]:
    (plugin,) = [d for d in _docs(helm.render(set_values=values)) if d["kind"] == "DaemonSet"]
    (ctr,) = plugin["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in ctr["env"] if "value" in e}


@pytest.mark.parametrize(("value", "env"), [("memory", "memory"), (4, "4"), ("disabled", None)])
def test_consumable_shares_value_reaches_the_plugin(value: str | int, env: str | None) -> None:
    assert (
        _plugin_env({"kubeletPlugin.sharing.consumableShares": value}).get("CONSUMABLE_SHARES")
        == env
    )
    assert "CONSUMABLE_SHARES" not in _plugin_env({})


def test_a_bad_consumable_shares_value_does_not_render() -> None:
    with pytest.raises(RuntimeError, match="must be memory, unlimited, a positive integer or "):
        helm.render(set_values={"kubeletPlugin.sharing.consumableShares": "half"})


def test_mig_mode_value_starts_the_plugin_in_dynamic_mode_and_leaves_static_unrendered() -> None:
    env = _plugin_env({"kubeletPlugin.migMode": "dynamic"})
    assert env["MIG_MODE"] == "dynamic"
    fields = {"NODE_NAME": "n", "POD_UID": "u1"}
    assert plugin_settings.build_settings({}, {**env, **fields}).mig_mode == "dynamic"
    # static is the plugin's default: nothing rendered, the default manifests are unchanged
    assert "MIG_MODE" not in _plugin_env({"kubeletPlugin.migMode": "static"})
    assert "MIG_MODE" not in _plugin_env({})
    with pytest.raises(RuntimeError, match='migMode must be static or dynamic, not "Dynamic"'):
        helm.render(set_values={"kubeletPlugin.migMode": "Dynamic"})


# ----- the ValidatingAdmissionPolicy ------------------------------------------------------


def _slice(node: str, *, name: str | None = None, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-test"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


class SliceClient:
    """ResourceSlice calls with a bearer token; returns the HTTP status and message."""

    def __init__(self, cluster: Cluster, token: str) -> None:
        from kubernetes import client

        config = client.Configuration()
        config.host = cluster.server
        config.ssl_ca_cert = str(cluster.ca_cert)
        config.api_key = {"authorization": f"Bearer {token}"}
        self._api = client.ApiClient(config)
        self._custom = client.CustomObjectsApi(self._api)

    def close(self) -> None:
        self._api.close()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            fn("resource.k8s.io", "v1", "resourceslices", *args, _request_timeout=30, **kwargs)
        except ApiException as exc:
            message = json.loads(exc.body).get("message", "") if exc.body else str(exc)
            return exc.status, message
        return 200, ""

    def create(self, body: dict[str, Any], *, dry_run: bool = False) -> tuple[int, str]:
        extra = {"dry_run": "All"} if dry_run else {}
        return self._call(self._custom.create_cluster_custom_object, body, **extra)

    def replace(self, body: dict[str, Any]) -> tuple[int, str]:
        return self._call(
            self._custom.replace_cluster_custom_object, body["metadata"]["name"], body
        )

    def delete(self, name: str) -> tuple[int, str]:
        return self._call(self._custom.delete_cluster_custom_object, name)

    def who_am_i(self) -> dict[str, Any]:
        from kubernetes import client

        review = client.AuthenticationV1Api(self._api).create_self_subject_review(
            as_body({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        )
        assert review.status is not None  # the API server always answers who the caller is
        info: dict[str, Any] = self._api.sanitize_for_serialization(review.status.user_info)
        return info


def _token(
    cluster: Cluster,
    *,
    node: dict[str, Any] | None,
    account: str = PLUGIN_SA,
    namespace: str = POLICY_NS,
) -> str:
    from kubernetes import client

    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if node is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node["metadata"]["name"],
            "uid": node["metadata"]["uid"],
        }
    with contextlib.closing(cluster.api_client()) as api:
        answer = client.CoreV1Api(api).create_namespaced_service_account_token(
            account,
            namespace,
            as_body(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
            ),
        )
    assert answer.status is not None and answer.status.token  # a granted request carries it
    return answer.status.token


def _identity_manifest(rendered: str) -> str:
    """The ServiceAccounts, RBAC and admission policies of a rendered chart, as one List."""
    wanted = {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    objects = [doc for doc in _docs(rendered) if doc["kind"] in wanted]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


@pytest.fixture(scope="module")
def plugin_identity(cluster: Cluster) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The chart's ServiceAccount, RBAC and policy applied for real; two registered nodes."""
    cluster.create_namespace(POLICY_NS)
    manifest = _identity_manifest(
        helm.render(namespace=POLICY_NS, set_values={"simulate.enabled": True})
    )
    cluster.kubectl("apply", "-f", "-", input=manifest)
    node_a = cluster.register_node("policy-node-a")
    node_b = cluster.register_node("policy-node-b")
    yield node_a, node_b
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest)
    for node in ("policy-node-a", "policy-node-b"):
        cluster.kubectl(
            "delete",
            "resourceslices",
            "--ignore-not-found",
            f"--field-selector=spec.nodeName={node}",
        )


@pytest.fixture
def as_node_a(
    cluster: Cluster, plugin_identity: tuple[dict[str, Any], dict[str, Any]]
) -> Iterator[SliceClient]:
    node_a, _node_b = plugin_identity
    slices = SliceClient(cluster, _token(cluster, node=node_a))
    # RBAC and the policy take effect asynchronously: wait until both are in force.
    wait_for(
        "RBAC to let the plugin create slices",
        lambda: slices.create(_slice("policy-node-a"), dry_run=True)[0] == 200,
    )
    wait_for(
        "the ValidatingAdmissionPolicy to refuse other nodes' slices",
        lambda: slices.create(_slice("policy-node-b"), dry_run=True)[0] == 403,
    )
    yield slices
    slices.close()


def test_node_bound_token_carries_the_node_name(as_node_a: SliceClient) -> None:
    info = as_node_a.who_am_i()
    assert info["username"] == f"system:serviceaccount:{POLICY_NS}:{PLUGIN_SA}"
    assert info["extra"]["authentication.kubernetes.io/node-name"] == ["policy-node-a"]


def test_plugin_writes_its_own_nodes_slice(as_node_a: SliceClient) -> None:
    own = _slice("policy-node-a")
    assert as_node_a.create(own) == (200, "")
    own["spec"]["devices"].append({"name": "gpu-1"})
    own["spec"]["pool"]["generation"] = 2
    assert as_node_a.replace(own) == (200, "")
    assert as_node_a.delete(own["metadata"]["name"]) == (200, "")


def test_plugin_is_refused_another_nodes_slice(cluster: Cluster, as_node_a: SliceClient) -> None:
    status, message = as_node_a.create(_slice("policy-node-b"))
    assert status == 403
    assert "may only write ResourceSlices of its own node" in message
    assert "policy-node-b" in message

    # A slice of node B made by an administrator: node A's plugin can neither change nor delete it.
    other = _slice("policy-node-b")
    cluster.kubectl("create", "-f", "-", input=json.dumps(other))
    try:
        other["spec"]["devices"] = []
        status, message = as_node_a.replace(other)
        assert status == 403 and "policy-node-b" in message
        status, message = as_node_a.delete(other["metadata"]["name"])
        assert status == 403 and "policy-node-b" in message
    finally:
        cluster.kubectl("delete", "resourceslice", other["metadata"]["name"])


def test_plugin_is_refused_another_drivers_slice_on_its_own_node(
    cluster: Cluster, as_node_a: SliceClient
) -> None:
    nic = "nic.example.com"
    status, message = as_node_a.create(_slice("policy-node-a", driver=nic))
    assert status == 403
    assert f"may only write its own driver's ResourceSlices, not those of driver {nic}" in message

    # Another driver's slice on node A, published by that driver: not node A's GPU plugin's to
    # rewrite or delete.
    other = _slice("policy-node-a", driver=nic)
    cluster.kubectl("create", "-f", "-", input=json.dumps(other))
    try:
        other["spec"]["devices"] = []
        status, message = as_node_a.replace(other)
        assert status == 403 and nic in message
        status, message = as_node_a.delete(other["metadata"]["name"])
        assert status == 403 and nic in message
    finally:
        cluster.kubectl("delete", "resourceslice", other["metadata"]["name"])


def test_plugin_cannot_move_its_slice_to_another_node(as_node_a: SliceClient) -> None:
    own = _slice("policy-node-a", name="policy-move-test")
    assert as_node_a.create(own) == (200, "")
    try:
        own["spec"]["nodeName"] = "policy-node-b"
        status, message = as_node_a.replace(own)
        assert status in (403, 422), message  # nodeName may also be immutable in the API
    finally:
        assert as_node_a.delete("policy-move-test") == (200, "")


def test_token_bound_to_no_node_writes_nothing(cluster: Cluster, as_node_a: SliceClient) -> None:
    unbound = SliceClient(cluster, _token(cluster, node=None))
    try:
        status, message = unbound.create(_slice("policy-node-a"), dry_run=True)
    finally:
        unbound.close()
    assert status == 403
    assert "carries no node name" in message


def _node_event(node: str, *, kind: str = "Node", name: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node}.policy-test", "namespace": "default"},
        "involvedObject": {"kind": kind, "name": name or node, "uid": name or node},
        "reason": "CheckpointCorrupt",
        "message": "policy test",
        "type": "Warning",
        "source": {"component": "gpu.nvidia.com-kubelet-plugin", "host": node},
    }


def _as_account(
    cluster: Cluster,
    tmp_path: Path,
    node: dict[str, Any] | None,
    account: str = PLUGIN_SA,
    namespace: str = POLICY_NS,
) -> KubeClient:
    token = _token(cluster, node=node, account=account, namespace=namespace)
    return connect(_kubeconfig(cluster, tmp_path / f"{account}.kubeconfig", token))


def _status_of(call: Callable[[], object]) -> tuple[int, str]:
    try:
        call()
    except errors.ApiError as exc:
        return exc.status or 0, exc.message
    return 200, ""


@pytest.fixture
def plugin_of_node_a(
    cluster: Cluster,
    plugin_identity: tuple[dict[str, Any], dict[str, Any]],
    as_node_a: SliceClient,
    tmp_path: Path,
) -> Iterator[KubeClient]:
    """The plugin's identity on node A, once its RBAC and policies are in force."""
    node_a, _node_b = plugin_identity
    client = _as_account(cluster, tmp_path, node_a)
    yield client
    client.close()


def test_plugin_posts_events_only_about_its_own_node(plugin_of_node_a: KubeClient) -> None:
    client = plugin_of_node_a
    events = "/api/v1/namespaces/default/events"

    def post(event: dict[str, Any]) -> tuple[int, str]:
        return _status_of(
            lambda: client.request("POST", events, query={"dryRun": "All"}, body=event)
        )

    wait_for(
        "the events policy to be in force",
        lambda: post(_node_event("policy-node-a", name="policy-node-b"))[0] == 403,
    )
    assert post(_node_event("policy-node-a")) == (200, "")
    status, message = post(_node_event("policy-node-a", name="policy-node-b"))
    assert status == 403
    assert "may only post Events about its own Node, not about Node policy-node-b" in message
    assert post(_node_event("policy-node-a", kind="Pod", name="victim"))[0] == 403
    spoofed = _node_event("policy-node-a")
    spoofed["source"]["host"] = "policy-node-b"
    assert post(spoofed)[0] == 403
    # RBAC grants Events in every namespace (for pods and claims): a Node's go in `default` only.
    elsewhere = _node_event("policy-node-a")
    elsewhere["metadata"]["namespace"] = POLICY_NS
    assert _dry_run_post(client, elsewhere)[0] == 422  # the API server's own validation
    elsewhere["involvedObject"]["namespace"] = POLICY_NS  # which this passes, the policy not
    status, message = _dry_run_post(client, elsewhere)
    assert status == 403
    assert f"posts its Node's Events in namespace default, not in {POLICY_NS}" in message


# ----- Events about pods and claims (PrepareFailed always; GpuIdle with metrics.enabled) -----

IDLE_RELEASE = "dra-gpu-idle"  # a second release, next to the first: its own account and policies
IDLE_NS = "dra-gpu-idle-policy"
IDLE_SA = "dra-gpu-idle-kubelet-plugin"
TEAM_NS = "idle-events-team"  # where a user's pods and claims are: neither default nor the driver's
CLAIM_EVENTS = f"{PLUGIN_SA}-claim-events"
IDLE_ON: dict[str, str | bool | int] = {"simulate.enabled": True, "metrics.enabled": True}


def _rendered_names(values: dict[str, str | bool | int]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in _docs(helm.render(set_values=values))}


@pytest.mark.parametrize(
    ("values", "idle"),
    [
        ({}, False),
        ({"metrics.enabled": True}, True),
        ({"metrics.enabled": True, "metrics.telemetry.idleAfter": "90s"}, True),
        ({"metrics.enabled": True, "metrics.telemetry.idleAfter": 0}, False),
        ({"metrics.enabled": True, "metrics.telemetry.idleAfter": "0s"}, False),
        ({"metrics.enabled": True, "metrics.telemetry.interval": 0}, False),
        ({"metrics.telemetry.idleAfter": "90s"}, False),
    ],
    ids=["defaults", "metrics", "idle-90s", "idle-0", "idle-0s", "no-telemetry", "no-metrics"],
)
def test_gpuidle_is_admitted_only_while_the_plugin_posts_it(
    values: dict[str, str | bool | int], idle: bool
) -> None:
    objects = _rendered_names(values)
    # The chart's condition and the plugin's own reading of the values it is given agree.
    settings = plugin_settings.build_settings(
        {}, {**_plugin_env(values), "NODE_NAME": "n", "POD_UID": "u1"}
    )
    posts = None not in (
        settings.metrics_address,
        settings.telemetry_interval_s,
        settings.idle_after_s,
    )
    assert posts == idle
    # PrepareFailed Events go into the claims' namespaces whatever the values: the plugin's own
    # ClusterRole grants Events everywhere, and no other role is rendered for them.
    role = objects[("ClusterRole", PLUGIN_SA)]
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in role["rules"]
    rbac = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert not [k for k in objects if k[0] in rbac and "events" in k[1]]
    policy = objects[("ValidatingAdmissionPolicy", CLAIM_EVENTS)]
    reasons = policy["spec"]["validations"][2]["expression"]
    assert "'PrepareFailed'" in reasons
    assert ("'GpuIdle'" in reasons) == idle
    # Together the two events policies judge every Event of the plugin: the node policy those
    # about Nodes, the claim policy every other one.
    node_policy = objects[("ValidatingAdmissionPolicy", f"{PLUGIN_SA}-own-node-events")]
    about = {c["name"]: c["expression"] for c in node_policy["spec"]["matchConditions"]}
    claim_about = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert about["about"].replace("==", "!=") == claim_about["about"]


@pytest.fixture(scope="module")
def idle_plugin_identity(
    cluster: Cluster, plugin_identity: tuple[dict[str, Any], dict[str, Any]]
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The chart with idle-claim Events on, released as ``IDLE_RELEASE``: its ServiceAccount,
    RBAC and policies applied for real; the nodes are those of ``plugin_identity``."""
    cluster.create_namespace(IDLE_NS)
    cluster.create_namespace(TEAM_NS)
    rendered = helm.render(release=IDLE_RELEASE, namespace=IDLE_NS, set_values=IDLE_ON)
    manifest = _identity_manifest(rendered)
    assert "GpuIdle" in manifest
    cluster.kubectl("apply", "-f", "-", input=manifest)
    yield plugin_identity
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest)


def _involved(kind: str, name: str, namespace: str = TEAM_NS) -> dict[str, str]:
    api_version = "resource.k8s.io/v1" if kind == "ResourceClaim" else "v1"
    uid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{kind}/{name}"))
    return {
        "apiVersion": api_version,
        "kind": kind,
        "namespace": namespace,
        "name": name,
        "uid": uid,
    }


IDLE_TEXT = (
    "GPU gpu-3 idle for 30m, 0 processes (claim idle-events-team/notebook, node policy-node-a)"
)


def _dry_run_post(client: KubeClient, event: dict[str, Any]) -> tuple[int, str]:
    namespace = event["metadata"]["namespace"]
    path = f"/api/v1/namespaces/{namespace}/events"
    return _status_of(lambda: client.request("POST", path, query={"dryRun": "All"}, body=event))


@pytest.fixture
def idle_plugin(
    cluster: Cluster,
    idle_plugin_identity: tuple[dict[str, Any], dict[str, Any]],
    tmp_path: Path,
) -> Iterator[tuple[KubeClient, dict[str, Any]]]:
    """The idle-events release's plugin on node A, once RBAC and the claim-events policy are in
    force, and the GpuIdle Event its telemetry loop sends about pod notebook-0
    (telemetry_wiring.start posts the same)."""
    from dra_gpu.plugin import telemetry_wiring

    node_a, _node_b = idle_plugin_identity
    client = _as_account(cluster, tmp_path, node_a, account=IDLE_SA, namespace=IDLE_NS)
    pod = _involved("Pod", "notebook-0")
    mine = telemetry_wiring.idle_event(pod, IDLE_TEXT, node="policy-node-a")
    try:
        wait_for(
            "RBAC and the claim-events policy to be in force",
            lambda: (
                _dry_run_post(client, mine)[0] == 200
                and _dry_run_post(client, {**mine, "reason": "Evicted"})[0] == 403
            ),
        )
        yield client, mine
    finally:
        client.close()


def test_plugin_posts_its_gpuidle_warnings_about_pods_and_claims_in_any_namespace(
    cluster: Cluster, idle_plugin: tuple[KubeClient, dict[str, Any]]
) -> None:
    from dra_gpu.kubeletplugin import events
    from dra_gpu.plugin import telemetry_wiring

    client, mine = idle_plugin
    # Posted for real, the way the loop posts it, and stored.
    events.post(client, mine)
    stored = json.loads(
        cluster.kubectl("get", "events", "-n", TEAM_NS, mine["metadata"]["name"], "-o", "json")
    )
    assert (stored["reason"], stored["involvedObject"]["name"]) == ("GpuIdle", "notebook-0")
    claim = _involved("ResourceClaim", "notebook")
    assert _dry_run_post(
        client, telemetry_wiring.idle_event(claim, IDLE_TEXT, node="policy-node-a")
    ) == (200, "")
    # Its Node events are still judged by the node policy.
    assert _dry_run_post(client, _node_event("policy-node-a")) == (200, "")
    assert _dry_run_post(client, _node_event("policy-node-a", name="policy-node-b"))[0] == 403


def test_plugin_may_post_no_other_event_about_pods_and_claims(
    cluster: Cluster, idle_plugin: tuple[KubeClient, dict[str, Any]], tmp_path: Path
) -> None:
    from dra_gpu.plugin import telemetry_wiring

    client, mine = idle_plugin
    secret = _involved("Secret", "db-password")
    refused: dict[str, tuple[dict[str, Any], str]] = {
        "another reason": (
            {**mine, "reason": "Evicted"},
            "may only post PrepareFailed or GpuIdle Warnings about pods and claims, not Warning"
            " Evicted",
        ),
        "a Normal event": ({**mine, "type": "Normal"}, "not Normal GpuIdle"),
        "a Normal PrepareFailed": (
            {**mine, "type": "Normal", "reason": "PrepareFailed"},
            "not Normal PrepareFailed",
        ),
        "another node as source": (
            telemetry_wiring.idle_event(
                _involved("Pod", "notebook-0"), IDLE_TEXT, node="policy-node-b"
            ),
            "must name its own node as the Event's source.host",
        ),
        "no source": ({**mine, "source": {"component": "x"}}, "source.host"),
        "another node as reporting instance": (
            {**mine, "reportingComponent": "x", "reportingInstance": "policy-node-b"},
            "reportingInstance",
        ),
        "a related object": ({**mine, "related": _involved("Pod", "other")}, "no related object"),
        "a Secret": (
            telemetry_wiring.idle_event(secret, IDLE_TEXT, node="policy-node-a"),
            f"not about Secret {TEAM_NS}/db-password",
        ),
    }
    for what, (event, says) in refused.items():
        status, message = _dry_run_post(client, event)
        assert status == 403, (what, status, message)
        assert says in message, (what, message)
    # A token of the same account bound to no node posts nothing.
    unbound = _as_account(cluster, tmp_path, None, account=IDLE_SA, namespace=IDLE_NS)
    try:
        status, message = _dry_run_post(unbound, mine)
    finally:
        unbound.close()
    assert status == 403 and "carries no node name" in message, message


class _ClaimServed:
    """The plugin's client, but a GET answers ``claim``: the claim a failed prepare reads, with
    the pod it is reserved for (a real one would need an allocation the test has no scheduler
    for). Events go to the API server as the plugin's token."""

    def __init__(self, client: KubeClient, claim: dict[str, Any]) -> None:
        self._client, self._claim = client, claim

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self._claim if method == "GET" else self._client.request(method, path, **kw)


@dataclasses.dataclass(frozen=True)
class _Ref:
    uid: str
    namespace: str
    name: str


@dataclasses.dataclass(frozen=True)
class _Failed:
    error: str


def _prepare_failed_event(involved: dict[str, str], *, node: str) -> dict[str, Any]:
    from dra_gpu.kubeletplugin import events

    return events.warning_event(
        involved,
        namespace=involved["namespace"],
        reason=events.REASON_PREPARE_FAILED,
        message="prepare failed",
        host=node,
        source=events.component(DRIVER_NAME),
    )


def test_plugin_posts_prepare_failures_on_claims_and_pods_of_any_namespace(
    cluster: Cluster, plugin_of_node_a: KubeClient
) -> None:
    # The first release runs without idle-claim Events: PrepareFailed gets through regardless.
    from dra_gpu.kubeletplugin import events
    from dra_gpu.kubeletplugin.driver import PrepareResult

    cluster.create_namespace(TEAM_NS)
    wait_for(
        "RBAC and the claim-events policy to be in force",
        lambda: (
            _dry_run_post(
                plugin_of_node_a,
                _prepare_failed_event(_involved("Pod", "p"), node="policy-node-a"),
            )[0]
            == 200
        ),
    )
    claim_uid = str(uuid.uuid4())
    claim = {
        "metadata": {"namespace": TEAM_NS, "name": "training", "uid": claim_uid},
        "status": {"reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "pod-1"}]},
    }
    served = _ClaimServed(plugin_of_node_a, claim)
    poster = events.EventPoster(served)  # type: ignore[arg-type]
    failures = events.FailureEvents(
        poster, node_name="policy-node-a", source=events.component(DRIVER_NAME)
    )
    failures.prepared(
        [_Ref(claim_uid, TEAM_NS, "training")],  # type: ignore[list-item]
        {claim_uid: PrepareResult(error="config[0] (FromClaim): sharing.strategy: unknown")},  # type: ignore[dict-item]
        0.001,
    )
    poster.close()  # the posts are done
    stored = json.loads(cluster.kubectl("get", "events", "-n", TEAM_NS, "-o", "json"))["items"]
    ours = sorted(
        (e["involvedObject"]["kind"], e["involvedObject"]["name"])
        for e in stored
        if e["reason"] == "PrepareFailed"
        and "sharing.strategy" in e["message"]
        and e["involvedObject"]["uid"] in (claim_uid, "pod-1")
    )
    assert ours == [("Pod", "trainer-0"), ("ResourceClaim", "training")]


def test_without_idle_events_the_plugin_may_post_no_other_event_about_pods(
    idle_plugin_identity: object, plugin_of_node_a: KubeClient
) -> None:
    # The first release runs without metrics: no GpuIdle anywhere, not even in `default`.
    from dra_gpu.plugin import telemetry_wiring

    pod = _involved("Pod", "p")
    failed = _prepare_failed_event(pod, node="policy-node-a")
    wait_for(
        "the claim-events policy to be in force",
        lambda: _dry_run_post(plugin_of_node_a, {**failed, "reason": "Evicted"})[0] == 403,
    )
    only = "may only post PrepareFailed Warnings about pods and claims, not Warning"
    refused: dict[str, tuple[dict[str, Any], str]] = {
        "GpuIdle in a team's namespace": (
            telemetry_wiring.idle_event(pod, IDLE_TEXT, node="policy-node-a"),
            f"{only} GpuIdle",
        ),
        "GpuIdle in default": (
            telemetry_wiring.idle_event(
                _involved("Pod", "p", namespace="default"), IDLE_TEXT, node="policy-node-a"
            ),
            f"{only} GpuIdle",
        ),
        "another reason": ({**failed, "reason": "Evicted"}, f"{only} Evicted"),
        "a Normal PrepareFailed": ({**failed, "type": "Normal"}, "not Normal PrepareFailed"),
        "another node as source": (
            _prepare_failed_event(pod, node="policy-node-b"),
            "must name its own node as the Event's source.host",
        ),
        "a Secret": (
            _prepare_failed_event(_involved("Secret", "db-password"), node="policy-node-a"),
            f"not about Secret {TEAM_NS}/db-password",
        ),
    }
    for what, (event, says) in refused.items():
        status, message = _dry_run_post(plugin_of_node_a, event)
        assert status == 403, (what, status, message)
        assert says in message, (what, message)
    # About a pod of another namespace: the API server's own validation refuses it.
    elsewhere = {**failed, "metadata": {**failed["metadata"], "namespace": "default"}}
    assert _dry_run_post(plugin_of_node_a, elsewhere)[0] == 422


def test_plugin_reads_claims_only_by_name(plugin_of_node_a: KubeClient) -> None:
    client = plugin_of_node_a
    claims = f"/apis/resource.k8s.io/v1/namespaces/{POLICY_NS}/resourceclaims"
    # Allowed, and absent: 404, not 403.
    assert _status_of(lambda: client.request("GET", f"{claims}/absent"))[0] == 404
    for path in (claims, "/apis/resource.k8s.io/v1/resourceclaims"):
        for query in ({}, {"watch": "true"}):
            status, _ = _status_of(functools.partial(client.request, "GET", path, query=query))
            assert status == 403, (path, query)


def _plugin_rules(kube_version: str) -> list[dict[str, Any]]:
    rendered = helm.render(namespace=POLICY_NS, kube_version=kube_version)
    (role,) = [
        d
        for d in _docs(rendered)
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == PLUGIN_SA
    ]
    return list(role["rules"])


@pytest.mark.parametrize(("version", "granular"), [("1.35.4", False), ("1.36.0", True)])
def test_plugin_role_grants_driver_status_only_where_the_server_checks_it(
    version: str, granular: bool
) -> None:
    rules = _plugin_rules(version)
    # patch only: the plugin's one write of a claim is a server-side apply, never a PUT
    assert {"resources": ["resourceclaims/status"], "verbs": ["patch"]}.items() <= next(
        r for r in rules if r["resources"] == ["resourceclaims/status"]
    ).items()
    driver_rules = [r for r in rules if r["resources"] == ["resourceclaims/driver"]]
    if not granular:
        assert driver_rules == []
        return
    (rule,) = driver_rules
    assert rule["resourceNames"] == [DRIVER]
    assert rule["verbs"] == ["associated-node:update", "associated-node:patch"]


def _allocated_claim(cluster: Cluster, name: str, node: str) -> dict[str, Any]:
    """A claim allocated (by the admin, as the scheduler would) to a device of our driver and
    one of another driver, on ``node``."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": POLICY_NS},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                    {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                ]
            }
        },
    }
    created = json.loads(
        cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(claim))
    )
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"},
        {"request": "nic", "driver": "nic.example.com", "pool": node, "device": "nic-0"},
    ]
    created["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    stored: dict[str, Any] = json.loads(
        cluster.kubectl(
            "replace", "--subresource=status", "-o", "json", "-f", "-", input=json.dumps(created)
        )
    )
    return stored


def test_plugin_writes_only_its_own_drivers_device_status(
    cluster: Cluster, plugin_of_node_a: KubeClient
) -> None:
    client = plugin_of_node_a
    _allocated_claim(cluster, "status-test", "policy-node-a")
    path = f"/apis/resource.k8s.io/v1/namespaces/{POLICY_NS}/resourceclaims/status-test/status"
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "lastTransitionTime": "2026-12-02T00:00:00Z",
    }

    # The plugin's token may patch a claim's status, not update (PUT) it: each write is a JSON
    # merge patch of the status, whose lists replace the stored ones as a PUT's would.
    def patch(target: str, status: dict[str, Any]) -> tuple[int, str]:
        return _status_of(
            lambda: client.request(
                "PATCH", target, body={"status": status}, content_type=MERGE_PATCH
            )
        )

    def write(driver: str, device: str) -> tuple[int, str]:
        entry = {
            "driver": driver,
            "pool": "policy-node-a",
            "device": device,
            "conditions": [ready],
            "data": {"uuid": "GPU-x"},
        }
        return patch(path, {"devices": [entry]})

    try:
        # Refused by the policy (403) before 1.36; from 1.36 the API server refuses first, as
        # an invalid change without resourceclaims/binding (422).
        if claim_driver_checked(client):
            status, message = patch(path, {"reservedFor": [_pod_ref()]})
            assert status == 422 and "resourceclaims/binding" in message, message
        else:
            wait_for(
                "the device status policy to be in force",
                lambda: patch(path, {"reservedFor": [_pod_ref()]})[0] == 403,
            )
            status, message = patch(path, {"reservedFor": [_pod_ref()]})
            assert "not a claim's allocation or reservedFor" in message, message
        assert write(DRIVER, "gpu-0") == (200, "")
        if claim_driver_checked(client):
            # Refused as an invalid change of the field (422), naming the permission.
            status, message = write("nic.example.com", "nic-0")
            assert status == 422 and "resourceclaims/driver" in message, message
        absent = f"/apis/resource.k8s.io/v1/namespaces/{POLICY_NS}/resourceclaims/absent/status"
        assert patch(absent, {"devices": []})[0] == 404
        # A PUT (update) is refused by RBAC: the role grants patch only.
        current = client.request("GET", path.removesuffix("/status"))
        assert _status_of(lambda: client.request("PUT", path, body=current))[0] == 403
    finally:
        cluster.kubectl("delete", "-n", POLICY_NS, "resourceclaim", "status-test", "--wait=false")


def _pod_ref() -> dict[str, str]:
    return {"resource": "pods", "name": "victim", "uid": "00000000-0000-0000-0000-000000000001"}


def claim_driver_checked(client: KubeClient) -> bool:
    """Whether this API server checks resourceclaims/driver (1.36 and later)."""
    version = str(client.request("GET", "/version")["gitVersion"])
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    return (major, minor) >= (1, 36)


def test_controller_writes_only_the_classes_it_owns(
    cluster: Cluster, plugin_identity: object, tmp_path: Path
) -> None:
    client = _as_account(cluster, tmp_path, None, account=CONTROLLER_SA)
    classes = "/apis/resource.k8s.io/v1/deviceclasses"
    owned = {"app.kubernetes.io/managed-by": "dra-gpu"}

    def write(method: str, path: str, labels: dict[str, str]) -> tuple[int, str]:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "policy-test.example.com", "labels": labels},
            "spec": {},
        }
        return _status_of(lambda: client.request(method, path, query={"dryRun": "All"}, body=body))

    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "someone-elses.example.com"},
        "spec": {},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(foreign))
    try:
        wait_for(
            "the classes policy to be in force",
            lambda: write("POST", classes, {})[0] == 403,
        )
        assert write("POST", classes, owned) == (200, "")
        status, message = write("POST", classes, {})
        assert status == 403
        assert "may only write DeviceClasses labelled app.kubernetes.io/managed-by" in message
        theirs = f"{classes}/someone-elses.example.com"
        assert (
            _status_of(lambda: client.request("DELETE", theirs, query={"dryRun": "All"}))[0] == 403
        )
        # Taking a class over by adding the label is an update of a class it does not own.
        current = json.loads(
            cluster.kubectl("get", "deviceclass", "someone-elses.example.com", "-o", "json")
        )
        current["metadata"]["labels"] = owned
        status, _ = _status_of(
            lambda: client.request("PUT", theirs, query={"dryRun": "All"}, body=current)
        )
        assert status == 403
    finally:
        cluster.kubectl("delete", "deviceclass", "someone-elses.example.com")
        client.close()


def _kubeconfig(cluster: Cluster, path: Path, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca_cert),
                },
            }
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_plugin_publishes_with_only_the_charts_permissions(
    cluster: Cluster, as_node_a: SliceClient, tmp_path: Path
) -> None:
    from e2e.driver import PluginProcess

    node_a = cluster.register_node("policy-node-a")
    kubeconfig = _kubeconfig(cluster, tmp_path / "plugin.kubeconfig", _token(cluster, node=node_a))
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path is too deep for them.
    short = Path(tempfile.mkdtemp(prefix="dra-gpu-chart-"))
    plugin = PluginProcess.simulated(
        short, node_name="policy-node-a", kubeconfig=kubeconfig, profile="h200x8"
    )
    plugin.start()
    try:

        def published() -> bool:
            if not plugin.alive:
                raise AssertionError(f"the plugin exited:\n{plugin.log_tail()}")
            out = cluster.kubectl(
                "get",
                "resourceslices",
                "-o",
                "json",
                "--field-selector=spec.nodeName=policy-node-a",
            )
            items = json.loads(out)["items"]
            return sum(len(s["spec"].get("devices", [])) for s in items) == 8

        try:
            wait_for("the plugin to publish node A's 8 simulated GPUs", published)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{plugin.log_tail()}") from None
        assert "403" not in plugin.log_tail(200), plugin.log_tail(200)
    finally:
        plugin.stop()
        shutil.rmtree(short, ignore_errors=True)


def test_controller_runs_with_only_the_charts_permissions(
    cluster: Cluster, plugin_identity: object, tmp_path: Path
) -> None:
    """The chart's controller identity can take its Lease and keep the DeviceClasses applied."""
    import sys

    from e2e.driver import ManagedProcess

    account = "dra-gpu-controller"
    token = _token(cluster, node=None, account=account)
    kubeconfig = _kubeconfig(cluster, tmp_path / "controller.kubeconfig", token)
    argv = [sys.executable, "-m", "dra_gpu", "controller", "--kubeconfig", str(kubeconfig)]
    argv += ["--lease-namespace", POLICY_NS, "--lease-name", account, "--identity", "chart-test"]
    controller = ManagedProcess("controller", argv, tmp_path / "controller.log", dict(os.environ))
    # Gone before the controller starts, so it must create it (not just find it).
    cluster.kubectl("delete", "deviceclass", "mig.nvidia.com", "--ignore-not-found")
    controller.start()
    try:

        def lease_held() -> bool:
            if not controller.alive:
                raise AssertionError(f"the controller exited:\n{controller.log_tail()}")
            out = cluster.kubectl(
                "get", "lease", "-n", POLICY_NS, account, "-o", "json", check=False
            )
            return bool(out) and json.loads(out)["spec"].get("holderIdentity") == "chart-test"

        wait_for("the controller to take its Lease", lease_held)

        def classes_applied() -> bool:
            classes = json.loads(cluster.kubectl("get", "deviceclasses", "-o", "json"))["items"]
            return {"gpu.nvidia.com", "mig.nvidia.com"} <= {c["metadata"]["name"] for c in classes}

        wait_for("the controller to create the DeviceClasses", classes_applied)
        assert "403" not in controller.log_tail(200), controller.log_tail(200)
    finally:
        controller.stop()


def test_telemetry_runs_in_the_host_pid_namespace_only_with_metrics_on() -> None:
    def plugin_spec(values: dict[str, str | bool | int]) -> dict[str, Any]:
        docs = _docs(helm.render(set_values=values))
        (plugin,) = [d for d in docs if d["kind"] == "DaemonSet"]
        spec: dict[str, Any] = plugin["spec"]["template"]["spec"]
        return spec

    assert "hostPID" not in plugin_spec({})
    on: dict[str, str | bool | int] = {"metrics.enabled": True}
    assert plugin_spec(on)["hostPID"] is True
    assert "hostPID" not in plugin_spec({**on, "metrics.telemetry.hostPID": False})
    env = _plugin_env({**on, "metrics.telemetry.idleAfter": "90s"})
    assert env["IDLE_AFTER"] == "90s" and env["TELEMETRY_INTERVAL"] == "10"


MERGE_PATCH = "application/merge-patch+json"


def _patch_node(client: KubeClient, node: str, body: dict[str, Any]) -> tuple[int, str]:
    return _status_of(
        lambda: client.request(
            "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH
        )
    )


def test_plugin_labels_only_its_own_node_and_only_nvidia_keys(
    cluster: Cluster,
    plugin_identity: tuple[dict[str, Any], dict[str, Any]],
    plugin_of_node_a: KubeClient,
    tmp_path: Path,
) -> None:
    client = plugin_of_node_a
    own = {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}
    # RBAC and the label policy take effect asynchronously: wait until both are in force.
    wait_for(
        "RBAC to let the plugin patch its node",
        lambda: _patch_node(client, "policy-node-a", own)[0] == 200,
    )
    wait_for(
        "the label policy to refuse another node",
        lambda: _patch_node(client, "policy-node-b", own)[0] == 403,
    )

    status, message = _patch_node(client, "policy-node-b", own)
    assert status == 403
    assert (
        "the kubelet plugin on node policy-node-a may only label its own Node, "
        "not node policy-node-b" in message
    )

    status, message = _patch_node(client, "policy-node-a", {"metadata": {"labels": {"team": "ml"}}})
    assert status == 403
    assert "may only change labels under nvidia.com/, not team" in message

    status, message = _patch_node(
        client, "policy-node-a", {"metadata": {"labels": {"kubernetes.io/hostname": None}}}
    )
    assert (status, "not kubernetes.io/hostname" in message) == (403, True), message

    status, message = _patch_node(client, "policy-node-a", {"spec": {"unschedulable": True}})
    assert status == 403 and "not its annotations, spec or owner references" in message

    (tmp_path / "unbound").mkdir()
    unbound = _as_account(cluster, tmp_path / "unbound", None)
    try:
        status, message = _patch_node(unbound, "policy-node-a", own)
        assert status == 403 and "carries no node name" in message
    finally:
        unbound.close()
    cluster.kubectl("label", "node", "policy-node-a", "nvidia.com/gpu.product-")


def _node_labels(cluster: Cluster, node: str) -> dict[str, str]:
    labels: dict[str, str] = json.loads(cluster.kubectl("get", "node", node, "-o", "json"))[
        "metadata"
    ].get("labels", {})
    return labels


def _slice_summary(cluster: Cluster, node: str) -> tuple[str, int, int]:
    """(product with spaces as -, physical GPUs, one GPU's memory in MiB) from a node's slices."""
    out = cluster.kubectl(
        "get", "resourceslices", "-o", "json", f"--field-selector=spec.nodeName={node}"
    )
    devices = [d for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])]
    gpus = {d["attributes"]["uuid"]["string"]: d for d in devices}
    (product,) = {d["attributes"]["productName"]["string"] for d in gpus.values()}
    (memory,) = {d["capacity"]["memory"]["value"] for d in gpus.values()}
    from dra_gpu.config.quantity import to_bytes

    return product.replace(" ", "-"), len(gpus), to_bytes(memory) >> 20


def test_plugin_keeps_gfd_labels_on_its_node_equal_to_its_slices(
    cluster: Cluster, as_node_a: SliceClient, tmp_path: Path
) -> None:
    from e2e.driver import PluginProcess

    node_a = cluster.register_node("policy-node-a")
    cluster.kubectl("label", "--overwrite", "node", "policy-node-a", "team=ml")
    kubeconfig = _kubeconfig(cluster, tmp_path / "plugin.kubeconfig", _token(cluster, node=node_a))
    short = Path(tempfile.mkdtemp(prefix="dra-gpu-labels-"))
    profile = short / "node-a.yaml"
    profile.write_text("gpus:\n  - product: H200-141GB\n    count: 3\n")
    plugin = PluginProcess.simulated(
        short,
        node_name="policy-node-a",
        kubeconfig=kubeconfig,
        profile=str(profile),
        extra=("--node-labels", "true"),
    )
    plugin.start()

    def labelled(count: str, driver: str) -> bool:
        plugin.check_alive()
        labels = _node_labels(cluster, "policy-node-a")
        return (
            labels.get("nvidia.com/gpu.count") == count
            and labels.get("nvidia.com/cuda.driver-version.full") == driver
        )

    try:
        try:
            wait_for("GFD's labels on node A", lambda: labelled("3", "580.159.04"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{plugin.log_tail()}") from None
        product, gpus, mib = _slice_summary(cluster, "policy-node-a")
        labels = _node_labels(cluster, "policy-node-a")
        assert (
            (
                labels["nvidia.com/gpu.product"],
                labels["nvidia.com/gpu.count"],
                labels["nvidia.com/gpu.memory"],
            )
            == (product, str(gpus), str(mib))
            == ("NVIDIA-H200", "3", "143771")
        )
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/cuda.driver.rev"] == "04"

        # Re-discovery: a GPU gone and another driver; the labels follow the slices.
        profile.write_text(
            'driverVersion: "590.48.01"\ncudaDriverVersion: "13.1"\n'
            "gpus:\n  - product: H200-141GB\n    count: 2\n"
        )
        wait_for("the labels to follow re-discovery", lambda: labelled("2", "590.48.01"))
        assert _slice_summary(cluster, "policy-node-a")[1] == 2
        assert _node_labels(cluster, "policy-node-a")["nvidia.com/cuda.runtime.minor"] == "1"
        assert "403" not in plugin.log_tail(200), plugin.log_tail(200)
    finally:
        plugin.stop()
        shutil.rmtree(short, ignore_errors=True)

    # Uninstall: the hook's command removes the plugin's labels, and only those.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_gpu",
            "remove-node-labels",
            "--kubeconfig",
            str(cluster.kubeconfig),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "node policy-node-a: removed" in done.stdout
    left = _node_labels(cluster, "policy-node-a")
    assert not [k for k in left if k.startswith("nvidia.com/")], left
    assert left["team"] == "ml"
    cluster.kubectl("label", "node", "policy-node-a", "team-")


def test_node_label_and_validation_values_render_what_they_say() -> None:
    defaults = {f"{d['kind']}/{d['metadata']['name']}": d for d in _docs(helm.render())}
    assert "ValidatingAdmissionPolicy/dra-gpu-kubelet-plugin-own-node-labels" in defaults
    hook = defaults["Job/dra-gpu-remove-node-labels"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert hook["spec"]["template"]["spec"]["containers"][0]["args"] == ["remove-node-labels"]
    assert _plugin_env({})["NODE_LABELS"] == "true"
    assert not [k for k in defaults if "validate" in k]

    values: dict[str, str | bool | int] = {
        "validation.enabled": True,
        "validation.nodes[0]": "gpu-node-1",
        "kubeletPlugin.nodeLabels.enabled": False,
    }
    off = {f"{d['kind']}/{d['metadata']['name']}": d for d in _docs(helm.render(set_values=values))}
    assert not [k for k in off if "node-labels" in k]
    assert _plugin_env(values)["NODE_LABELS"] == "false"
    job = off["Job/dra-gpu-validate-0"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["validate", "--node=gpu-node-1"]
    assert "--namespace=dra-gpu" in args and "--cdi-root=/var/run/cdi" in args
