"""Names and addresses of the admission webhook, shared by the server and its registrations.

The chart's ValidatingWebhookConfiguration (``manifests/helm/dra-gpu/templates/webhook.yaml``)
is the one registration: three webhooks, one endpoint. ``claims.``: ResourceClaims and
ResourceClaimTemplates that carry a config of this driver, failure policy from the chart's values
(Fail by default). ``selectors.``: claims and templates without such a config whose selectors
name the driver, only to warn, Ignore. ``classes.``: DeviceClasses with a config or selectors of
the driver, Ignore. Tests and benchmarks point the chart's configuration at a local process
(``e2e.helm.webhook_configuration``), with :func:`client_config_url`.
"""

from __future__ import annotations

import base64
from typing import Any, Final

WEBHOOK_NAME: Final = "claims.gpu.nvidia.com"
SELECTORS_WEBHOOK_NAME: Final = "selectors.gpu.nvidia.com"
CLASSES_WEBHOOK_NAME: Final = "classes.gpu.nvidia.com"
VALIDATE_PATH: Final = "/validate"


def client_config_url(url: str, *, ca_bundle_pem: bytes) -> dict[str, Any]:
    """``clientConfig`` for a webhook reached by URL (local processes, tests)."""
    return {"url": url, "caBundle": base64.b64encode(ca_bundle_pem).decode()}
