"""The driver's built-in DeviceClasses on a test cluster that runs no controller."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dra_gpu.controller import classes
from e2e.cluster import Cluster
from e2e.kube_json import as_body


@contextlib.contextmanager
def builtin_device_classes(cluster: Cluster) -> Iterator[None]:
    """The built-in DeviceClasses; those this context had to create are removed afterwards."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.ResourceV1Api(cluster.api_client())
    created = []
    for desired in classes.builtin_classes(extended_resource_name=None):
        try:
            api.create_device_class(as_body(desired.body()), _request_timeout=30)
            created.append(desired.name)
        except ApiException as exc:
            if exc.status != 409:
                raise
    yield
    for name in created:
        with contextlib.suppress(ApiException):
            api.delete_device_class(name, _request_timeout=30)
