"""The real control plane checks and acts on DRA objects the way a production cluster does.

Cases:
- a DeviceClass with a CEL selector is stored as written;
- DeviceClasses with a syntax error, a type error or a non-boolean CEL expression are rejected with
  the API server's own message;
- a ResourceSlice with 128 devices is accepted, one with 129 is rejected (API server message);
- a Pod with a ResourceClaimTemplate: the resourceclaim controller creates the claim, the scheduler
  allocates a device of the node's ResourceSlice to it and binds the pod to that node;
- ValidatingAdmissionPolicy and an admission webhook served on loopback both deny requests;
- a simulated node (no kubelet) takes only pods that tolerate its taint, and deleting the
  namespace of a pod bound there completes (the harness confirms the deletion, as a kubelet
  would): without either, a user's pod sat there never started and its namespace never went.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import SIMULATED_TOLERATION, Cluster
from e2e.kube_json import as_body, as_json
from e2e.waiting import wait_for

GROUP, VERSION = "resource.k8s.io", "v1"
NAMESPACE = "cp-tests"
WAIT_S = 60.0  # bounds a broken control plane only


def api_message(exc: ApiException) -> str:
    return str(json.loads(str(exc.body))["message"])


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[client.ApiClient]:
    cluster.create_namespace(NAMESPACE)
    with cluster.api_client() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    # The generic client: plain dicts in and out, the same path as the typed resource.k8s.io API.
    return client.CustomObjectsApi(api)


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(name: str, *, driver: str, devices: int, node: str | None) -> dict[str, Any]:
    placement: dict[str, Any] = {"nodeName": node} if node else {"allNodes": True}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            **placement,
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"index": {"int": i}, "model": {"string": "test-gpu"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def test_device_class_with_cel_selector_is_stored(custom: client.CustomObjectsApi) -> None:
    expression = (
        'device.driver == "gpu.cp.example.com" && '
        "device.capacity['gpu.cp.example.com'].memory.compareTo(quantity('40Gi')) >= 0"
    )
    body = device_class("cp-valid-class", expression)
    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
    try:
        stored = as_json(
            custom.get_cluster_custom_object(GROUP, VERSION, "deviceclasses", "cp-valid-class")
        )
        assert stored["spec"]["selectors"] == [{"cel": {"expression": expression}}]
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", "cp-valid-class")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "a" &&', "Syntax error"),
        ("device.driver + 1", "found no matching overload for '_+_'"),
        ("device.driver", "must evaluate to bool"),
    ],
    ids=["syntax-error", "type-error", "not-boolean"],
)
def test_device_class_with_invalid_cel_is_rejected(
    custom: client.CustomObjectsApi, expression: str, expected: str
) -> None:
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", device_class("cp-invalid-class", expression)
        )
    assert err.value.status == 422
    message = api_message(err.value)
    assert "spec.selectors[0].cel.expression: Invalid value" in message
    assert expected in message


@pytest.mark.parametrize(
    ("devices", "accepted"), [(128, True), (129, False)], ids=["128-accepted", "129-rejected"]
)
def test_resource_slice_device_limit(
    custom: client.CustomObjectsApi, devices: int, accepted: bool
) -> None:
    name = f"cp-limit-{devices}"
    body = resource_slice(name, driver="limits.cp.example.com", devices=devices, node=None)
    if accepted:
        created = as_json(
            custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
        )
        assert len(created["spec"]["devices"]) == devices
        custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        return
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
    assert err.value.status == 422
    assert "spec.devices: Too many: 129: must have at most 128 items" in api_message(err.value)


def test_pod_claim_is_created_allocated_and_pod_bound(
    cluster: Cluster, api: client.ApiClient, custom: client.CustomObjectsApi
) -> None:
    driver, node = "sched.cp.example.com", "cp-node-0"
    cls = device_class("cp-sched-class", f'device.driver == "{driver}"')
    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)
    cluster.register_node(node, {"cp.example.com/gpu": "true"})
    slice_body = resource_slice("cp-node-0-gpus", driver=driver, devices=2, node=node)
    custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", slice_body)
    template = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "cp-sched-class"}}]
                }
            }
        },
    }
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, "resourceclaimtemplates", template
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod"},
        "spec": {
            "tolerations": [dict(SIMULATED_TOLERATION)],  # the node is simulated
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "example.invalid/never-pulled:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(NAMESPACE, as_body(pod))

    def claim_name() -> str | None:
        status = core.read_namespaced_pod("gpu-pod", NAMESPACE).status
        for entry in (status.resource_claim_statuses if status else None) or []:
            if entry.name == "gpu" and entry.resource_claim_name:
                return str(entry.resource_claim_name)
        return None

    name = wait_for(
        "the resourceclaim controller to create the pod's claim", claim_name, timeout=WAIT_S
    )
    claim = as_json(
        custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "resourceclaims", name)
    )
    assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == ["gpu-pod"]

    def allocation() -> dict[str, Any] | None:
        got = as_json(
            custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "resourceclaims", name)
        )
        found: dict[str, Any] | None = got.get("status", {}).get("allocation")
        return found

    allocated = wait_for(
        "the scheduler to allocate a device to the claim", allocation, timeout=WAIT_S
    )
    (result,) = allocated["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (
        driver,
        "cp-node-0-gpus",
        "gpu",
    )
    assert result["device"] in {"gpu-0", "gpu-1"}

    def node_name() -> str | None:
        spec = core.read_namespaced_pod("gpu-pod", NAMESPACE).spec
        return spec.node_name if spec else None

    bound = wait_for("the scheduler to bind the pod", node_name, timeout=WAIT_S)
    assert bound == node
    core.delete_namespaced_pod("gpu-pod", NAMESPACE, grace_period_seconds=0)
    custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", "cp-node-0-gpus")
    custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", "cp-sched-class")


def test_simulated_node_takes_only_tolerating_pods_and_their_namespace_goes(
    cluster: Cluster, api: client.ApiClient
) -> None:
    node, namespace = "cp-sim-0", "cp-sim"
    cluster.register_node(node)
    cluster.create_namespace(namespace)
    core = client.CoreV1Api(api)

    def pod(name: str, tolerations: list[dict[str, str]]) -> dict[str, Any]:
        spec = {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": tolerations,
            "containers": [{"name": "main", "image": "example.invalid/never-pulled:1"}],
        }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    core.create_namespaced_pod(namespace, as_body(pod("stray", [])))
    core.create_namespaced_pod(namespace, as_body(pod("ours", [dict(SIMULATED_TOLERATION)])))

    def unschedulable() -> str | None:
        status = core.read_namespaced_pod("stray", namespace).status
        for c in (status.conditions if status else None) or []:
            if c.type == "PodScheduled" and c.reason == "Unschedulable":
                return str(c.message)
        return None

    message = wait_for("the scheduler to turn the stray pod down", unschedulable, timeout=WAIT_S)
    assert "untolerated taint" in message, message

    def bound() -> str | None:
        spec = core.read_namespaced_pod("ours", namespace).spec
        return spec.node_name if spec else None

    assert wait_for("the scheduler to bind the tolerating pod", bound, timeout=WAIT_S) == node

    core.delete_namespace(namespace)

    def gone() -> bool:
        try:
            core.read_namespace(namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_for(f"namespace {namespace} to be deleted", gone, timeout=WAIT_S)
    cluster.unregister_node(node)


def _labelled_configmap(label: str) -> dict[str, Any]:
    return {"metadata": {"generateName": "cp-", "labels": {label: "yes"}}, "data": {"k": "v"}}


def _wait_denied(core: client.CoreV1Api, label: str, *, what: str) -> str:
    """Dry-run a labelled ConfigMap until admission denies it; return the denial message."""

    def denial() -> str | None:
        try:
            core.create_namespaced_config_map(
                NAMESPACE, as_body(_labelled_configmap(label)), dry_run="All"
            )
        except ApiException as exc:
            if exc.status in (400, 403, 422):
                return api_message(exc)
            raise
        return None

    return wait_for(what, denial, timeout=30)


def test_validating_admission_policy_denies(api: client.ApiClient) -> None:
    reg = client.AdmissionregistrationV1Api(api)
    policy = {
        "metadata": {"name": "cp-deny-label"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "!('cp-vap-deny' in object.metadata.?labels.orValue({}))",
                    "message": "label cp-vap-deny is not allowed here",
                }
            ],
        },
    }
    binding = {
        "metadata": {"name": "cp-deny-label"},
        "spec": {
            "policyName": "cp-deny-label",
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
            },
        },
    }
    reg.create_validating_admission_policy(as_body(policy))
    reg.create_validating_admission_policy_binding(as_body(binding))
    try:
        message = _wait_denied(
            client.CoreV1Api(api), "cp-vap-deny", what="the policy to deny the ConfigMap"
        )
        assert "label cp-vap-deny is not allowed here" in message
    finally:
        reg.delete_validating_admission_policy_binding("cp-deny-label")
        reg.delete_validating_admission_policy("cp-deny-label")


class _DenyLabelled(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        labels = review["request"]["object"]["metadata"].get("labels", {})
        allowed = "cp-webhook-deny" not in labels
        response = {"uid": review["request"]["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "message": "denied by the test webhook"}
        body = json.dumps({**review, "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_admission_webhook_on_loopback_denies(cluster: Cluster, api: client.ApiClient) -> None:
    cert, key = cluster.issue_serving_cert("cp-webhook", ["127.0.0.1"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DenyLabelled)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    webhook = {
        "metadata": {"name": "cp-deny-label"},
        "webhooks": [
            {
                "name": "deny.cp.example.com",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate",
                    "caBundle": base64.b64encode(cluster.ca_cert.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }
    reg = client.AdmissionregistrationV1Api(api)
    reg.create_validating_webhook_configuration(as_body(webhook))
    try:
        message = _wait_denied(
            client.CoreV1Api(api), "cp-webhook-deny", what="the webhook to deny the ConfigMap"
        )
        assert 'admission webhook "deny.cp.example.com" denied the request' in message
        assert "denied by the test webhook" in message
    finally:
        reg.delete_validating_webhook_configuration("cp-deny-label")
        server.shutdown()
