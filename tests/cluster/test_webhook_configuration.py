"""``e2e.helm.webhook_configuration``: the chart's own ValidatingWebhookConfiguration, sent to a
webhook run as a local process (the demo registers it so).

Cases: every webhook of the chart goes to the given URL, nothing else of the rendered
configuration changes; ``namespaces`` and ``class_selector`` limit the namespaced and the
cluster-scoped webhooks, and only when given.
"""

from __future__ import annotations

from typing import Any

import yaml

from dra_gpu.controller import registration
from e2e import helm

CLIENT = {"url": "https://127.0.0.1:8443/validate", "caBundle": "Y2E="}


def _chart() -> dict[str, Any]:
    rendered = helm.render(set_values={"webhook.enabled": True, "webhook.tls.caBundle": "Cg=="})
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (config,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    return dict(config)


def _by_name(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in config["webhooks"]}


def test_the_charts_webhooks_go_to_the_url_and_are_otherwise_unchanged() -> None:
    config = helm.webhook_configuration("demo", CLIENT)
    assert config["metadata"] == {"name": "demo"}
    chart = _by_name(_chart())
    assert (
        set(_by_name(config))
        == set(chart)
        >= {
            registration.WEBHOOK_NAME,
            registration.CLASSES_WEBHOOK_NAME,
        }
    )
    for name, webhook in _by_name(config).items():
        assert webhook == {**chart[name], "clientConfig": CLIENT}


def test_namespaces_and_a_class_selector_limit_it_when_given() -> None:
    config = helm.webhook_configuration(
        "tests", CLIENT, namespaces=["ns-a"], class_selector={"matchLabels": {"k": "v"}}
    )
    webhooks, chart = _by_name(config), _by_name(_chart())
    claims = webhooks[registration.WEBHOOK_NAME]
    only = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ns-a"]}
    assert only in claims["namespaceSelector"]["matchExpressions"]
    assert claims.get("objectSelector") == chart[registration.WEBHOOK_NAME].get("objectSelector")
    classes = webhooks[registration.CLASSES_WEBHOOK_NAME]
    assert classes["objectSelector"] == {"matchLabels": {"k": "v"}}
    unlimited = chart[registration.CLASSES_WEBHOOK_NAME].get("namespaceSelector")
    assert classes.get("namespaceSelector") == unlimited
