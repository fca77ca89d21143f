"""Plain dicts in and out of the generated Kubernetes client.

The harness writes Kubernetes objects as dicts, like the manifests. The client (typed since
kubernetes 35) names only its model classes (``V1Pod`` ...) as request bodies, yet sends a dict
as it is; and its custom-objects calls return the decoded JSON typed as ``object``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_body(doc: Mapping[str, Any]) -> Any:
    """``doc`` as a request body. ``Any`` because the client's parameters accept only its models
    in their annotations, while it serializes a dict unchanged."""
    return dict(doc)


def as_json(result: object) -> dict[str, Any]:
    """A custom-objects call's result (decoded JSON) as the object it is."""
    if not isinstance(result, dict):
        raise TypeError(f"expected a JSON object from the API, got {type(result).__name__}")
    return result
