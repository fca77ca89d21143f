"""The Kubernetes side of prepare: fetch ResourceClaims, report node warnings as Events.

Thin I/O over ``kube.client.KubeClient`` (plain JSON, no client models): ``KubeClaimFetcher``
implements ``state.ClaimFetcher``; ``NodeEventReporter`` implements ``state.Report`` by queuing a
Warning Event on this node's Node object (shown by ``kubectl describe node``) for the kit's
Event poster. Reporting is best effort and never waits for the API server: a report made under
a lock (the checkpoint's salvage) makes no API call under it.
"""

from __future__ import annotations

import logging
from typing import cast

from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.objects import ResourceClaim, claim_path
from dra_gpu.kubeletplugin import events
from dra_gpu.prepare.plan import PlanError

log = logging.getLogger(__name__)


class KubeClaimFetcher:
    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        path = claim_path(namespace, name)
        try:
            # The API boundary: the server's JSON is taken to be a ResourceClaim, unchecked.
            return cast(ResourceClaim, self._client.request("GET", path))
        except errors.NotFound:
            return None
        except RecursionError as err:
            # Python's JSON decoder stops at about 1,000 levels, the API server at 10,000: only
            # a claim's opaque parameters can nest that deep. The user's to fix, not a bug here.
            raise PlanError(
                f"claim {namespace}/{name} cannot be read: it is nested too deeply (more than "
                "about 1000 levels; look at its config[].opaque.parameters)"
            ) from err


class NodeEventReporter:
    """``report(reason, message)`` -> a Warning Event on the Node ``node_name``, queued."""

    def __init__(self, poster: events.EventPoster, *, node_name: str, source: str) -> None:
        self._poster, self._node, self._source = poster, node_name, source

    def __call__(self, reason: str, message: str) -> None:
        log.warning("%s: %s", reason, message)
        # The uid is the node name, as the kubelet does; ``kubectl describe node`` matches it.
        involved = {"kind": "Node", "name": self._node, "uid": self._node}
        self._poster.post(
            events.warning_event(
                involved,
                namespace="default",
                reason=reason,
                message=message,
                host=self._node,
                source=self._source,
            )
        )
