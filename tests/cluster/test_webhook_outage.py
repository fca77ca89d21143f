"""The chart's webhook configuration while the webhook is down, against the real API server.

The chart's ValidatingWebhookConfiguration (its rules, namespace selector and match conditions as
rendered, failurePolicy Fail by default) is pointed at the webhook server run in this process,
limited to this module's namespace and kube-system. Once it is seen refusing a bad claim, a claim
with a valid GpuConfig is created, and the webhook is stopped.

Cases, with the webhook down:
- another driver's claim, a claim without config whose selector names gpu.nvidia.com, and a
  claim with a GpuConfig in kube-system are all created;
- removing the finalizer of the claim with a GpuConfig, and labelling it, both succeed;
- a new claim with a GpuConfig is refused, naming the claims webhook (failurePolicy Fail, as
  docs/user/security.md says).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from dra_gpu.controller import admission, certs, registration, serving
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient, connect
from e2e import helm, waiting
from e2e.cluster import Cluster

NS = "dra-gpu-webhook-outage"
WEBHOOK_CONFIG = "dra-gpu-webhook-outage-test"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
DRIVER = "gpu.nvidia.com"
FINALIZER = "dra-gpu.test/outage"


def claims_path(namespace: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


def claim(
    name: str,
    *,
    namespace: str = NS,
    driver: str | None = DRIVER,
    parameters: dict[str, Any] | None = None,
    selector: str | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if driver is not None:
        params = parameters or {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": params}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def bad_claim() -> dict[str, Any]:
    return claim(
        "probe",
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "Sometimes"},
        },
    )


def refused_by_webhook(client: KubeClient) -> bool:
    try:
        client.call("POST", claims_path(NS), query={"dryRun": "All"}, body=bad_claim())
    except errors.ApiError as exc:
        return registration.WEBHOOK_NAME in exc.message
    return False


@pytest.fixture(scope="module")
def webhook_down(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeClient]:
    """The chart's configuration in force; a claim with a GpuConfig and a finalizer; then the
    webhook stopped."""
    client = connect(cluster.kubeconfig)
    cluster.create_namespace(NS)
    files = certs.ensure_self_signed(tmp_path_factory.mktemp("outage") / "certs")
    server = serving.WebhookServer(
        host="127.0.0.1", port=0, context=certs.server_context(files), reviewer=admission.review
    )
    server.start()
    assert files.ca is not None
    config = helm.webhook_configuration(
        WEBHOOK_CONFIG,
        registration.client_config_url(
            f"https://127.0.0.1:{server.port}/validate", ca_bundle_pem=files.ca.read_bytes()
        ),
        namespaces=[NS, "kube-system"],
        class_selector={"matchLabels": {"dra-gpu.test/webhook-outage": "true"}},
    )
    client.request("POST", WEBHOOKS, body=config)
    try:
        try:
            waiting.wait_for(
                "the webhook to be in effect", lambda: refused_by_webhook(client), timeout=60
            )
            kept = claim("kept")
            kept["metadata"]["finalizers"] = [FINALIZER]
            client.request("POST", claims_path(NS), body=kept)
        finally:
            server.stop()
        yield client
    finally:
        with contextlib.suppress(errors.NotFound):
            client.request("DELETE", f"{WEBHOOKS}/{WEBHOOK_CONFIG}")
        with contextlib.suppress(errors.NotFound):
            kept = client.request("GET", f"{claims_path(NS)}/kept")
            kept["metadata"]["finalizers"] = []
            client.request("PUT", f"{claims_path(NS)}/kept", body=kept)
        with contextlib.suppress(errors.NotFound):
            client.request("DELETE", f"{claims_path('kube-system')}/outage-test")
        client.request("DELETE", f"/api/v1/namespaces/{NS}")
        client.close()


def create(client: KubeClient, body: dict[str, Any]) -> None:
    client.request("POST", claims_path(body["metadata"]["namespace"]), body=body)


def test_other_drivers_claims_are_created(webhook_down: KubeClient) -> None:
    create(webhook_down, claim("nic", driver="nic.example.com"))
    create(webhook_down, claim("no-config", driver=None))


def test_claim_with_only_a_selector_naming_the_driver_is_created(webhook_down: KubeClient) -> None:
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
    create(webhook_down, claim("selector-only", driver=None, selector=selector))


def test_system_namespace_claim_is_created(webhook_down: KubeClient) -> None:
    create(webhook_down, claim("outage-test", namespace="kube-system"))


def test_label_and_finalizer_changes_succeed(webhook_down: KubeClient) -> None:
    path = f"{claims_path(NS)}/kept"
    kept = webhook_down.request("GET", path)
    kept["metadata"]["labels"] = {"team": "a"}
    kept = webhook_down.request("PUT", path, body=kept)
    kept["metadata"]["finalizers"] = []
    kept = webhook_down.request("PUT", path, body=kept)
    assert kept["metadata"]["labels"] == {"team": "a"}
    assert not kept["metadata"].get("finalizers")


def test_claim_with_a_gpu_config_is_refused_naming_the_webhook(webhook_down: KubeClient) -> None:
    with pytest.raises(errors.ApiError) as refused:
        create(webhook_down, claim("with-config"))
    assert f'failed calling webhook "{registration.WEBHOOK_NAME}"' in refused.value.message


def test_the_chart_fails_closed_only_for_claims_with_a_config() -> None:
    """The defaults the tests above rely on (docs/user/security.md says why)."""
    config = helm.webhook_configuration(
        "x", {"url": "https://127.0.0.1:1/validate"}, namespaces=[NS], class_selector={}
    )
    policies = {w["name"]: w["failurePolicy"] for w in config["webhooks"]}
    assert policies == {
        registration.WEBHOOK_NAME: "Fail",
        registration.SELECTORS_WEBHOOK_NAME: "Ignore",
        registration.CLASSES_WEBHOOK_NAME: "Ignore",
    }
