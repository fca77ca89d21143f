"""Claims for one MIG device of a profile, and a pod pinned to a node that uses one.

Shared by the dynamic-MIG demo example, its cluster test and ``bench/dynamic_mig.py``.
"""

from __future__ import annotations

from typing import Any

from dra_gpu import DRIVER_NAME
from e2e.cluster import SIMULATED_TOLERATION
from e2e.images.node_images import TEST_IMAGE

REQUEST = "mig"
# As the scenarios' pods: the report, then wait, ending at once on SIGTERM (a deleted pod goes).
REPORT_THEN_SLEEP = (
    'trap "exit 0" TERM; echo "== env"; env | sort; echo "== devices"; '
    'find /dev -name "nvidia*" | sort; echo "== end"; sleep 100000 & wait'
)


def devices(profile: str) -> dict[str, Any]:
    """``spec.devices`` of a claim for one MIG device of ``profile`` (e.g. ``3g.40gb``)."""
    selector = f'device.attributes["{DRIVER_NAME}"].profile == "{profile}"'
    exactly = {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": selector}}],
    }
    return {"requests": [{"name": REQUEST, "exactly": exactly}]}


def claim(name: str, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices(profile)},
    }


def claim_template(name: str, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices(profile)}},
    }


def pod(
    name: str, node: str, *, template: str | None = None, claim: str | None = None
) -> dict[str, Any]:
    """A pod on ``node`` using the claim from ``template``, or the claim named ``claim``;
    ``node`` may be a simulated one (the pod tolerates its taint)."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [dict(SIMULATED_TOLERATION)],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "ctr",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    # The report the scenarios' containers print (e2e.suite.views.parse_report).
                    "command": ["sh", "-c", REPORT_THEN_SLEEP],
                    "resources": {"claims": [{"name": REQUEST}]},
                }
            ],
            "resourceClaims": [{"name": REQUEST, **source}],
        },
    }
