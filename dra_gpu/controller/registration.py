"""The ValidatingWebhookConfiguration that sends claims to a webhook run as a local process.

The chart writes its own (a Service in front of the pods); this one, reached by URL, is for
tests and benchmarks.

Two webhooks, one endpoint. ``claims.``: ResourceClaims and ResourceClaimTemplates of
``resource.k8s.io`` on CREATE and UPDATE, failure policy Fail. ``classes.``: DeviceClasses
(cluster-scoped), failure policy Ignore, so the DeviceClasses installed with the chart, before the
webhook's pod is up, are never blocked (they carry no config to check). Both for ``v1`` only: with
``matchPolicy: Equivalent`` the API server converts requests made through older API versions to
``v1`` before calling us, so the webhook reads one shape. ``sideEffects: None`` lets server-side
dry-run requests reach it.
"""

from __future__ import annotations

import base64
from typing import Any, Final

WEBHOOK_NAME: Final = "claims.gpu.nvidia.com"
CLASSES_WEBHOOK_NAME: Final = "classes.gpu.nvidia.com"
VALIDATE_PATH: Final = "/validate"


def client_config_url(url: str, *, ca_bundle_pem: bytes) -> dict[str, Any]:
    """``clientConfig`` for a webhook reached by URL (local processes, tests)."""
    return {"url": url, "caBundle": base64.b64encode(ca_bundle_pem).decode()}


def validating_webhook_configuration(
    name: str,
    client_config: dict[str, Any],
    *,
    namespaces: list[str] | None = None,
    class_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The configuration; ``namespaces`` and ``class_selector`` (an object selector for
    DeviceClasses) limit it, so tests leave everything else of a shared cluster alone."""
    selector: dict[str, Any] = {}
    if namespaces is not None:
        selector = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
            ]
        }
    common = {
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": client_config,
                "rules": [_rule(["resourceclaims", "resourceclaimtemplates"], "Namespaced")],
                "namespaceSelector": selector,
                "failurePolicy": "Fail",
                **common,
            },
            {
                "name": CLASSES_WEBHOOK_NAME,
                "clientConfig": client_config,
                "rules": [_rule(["deviceclasses"], "Cluster")],
                "objectSelector": class_selector or {},
                "failurePolicy": "Ignore",
                **common,
            },
        ],
    }


def _rule(resources: list[str], scope: str) -> dict[str, Any]:
    return {
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": resources,
        "scope": scope,
    }
