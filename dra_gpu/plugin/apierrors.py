"""Errors of the Kubernetes API as the plugin's logic sees them, without the client library.

The thin I/O module (``kubeapi``) maps HTTP statuses and connection failures onto these; the
publisher decides by type: temporary errors are retried with backoff, conflicts and missing
objects mean "look again now", anything else is permanent until the next resync.
"""

from __future__ import annotations


class ApiError(Exception):
    """A request to the API server failed. ``status`` is None when no response came back."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ApiUnavailable(ApiError):
    """No answer, a timeout, 429 or a 5xx: the API server may come back, retry with backoff."""


class NotFound(ApiError):
    """404: the object (or the Node we need as owner) does not exist."""


class Conflict(ApiError):
    """409: stale resourceVersion, an object that already exists, or a failed precondition."""


def from_status(status: int | None, message: str) -> ApiError:
    """The error type for an HTTP status (None: the request got no response)."""
    if status is None or status == 429 or status >= 500:
        return ApiUnavailable(message, status=status)
    if status == 404:
        return NotFound(message, status=status)
    if status == 409:
        return Conflict(message, status=status)
    return ApiError(message, status=status)
