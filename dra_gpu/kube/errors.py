"""Errors of the Kubernetes API as our logic sees them; raised only by :mod:`client` and
:mod:`transport`.

Callers decide by type, never by parsing messages:

- :class:`ApiUnavailable`: no answer, a timeout, 429 or a 5xx. The API server may come back:
  retry with backoff.
- :class:`NotFound` (404), :class:`Conflict` (409: a stale resourceVersion or a failed
  precondition; :class:`AlreadyExists` when a create met an existing object), :class:`Gone`
  (410: a watch's resourceVersion is too old, list again). Each means "look again now".
- anything else is an :class:`ApiError`: permanent until something changes.

``message`` is the server's own text (``Status.message``); ``str(err)`` adds the request it
answered, e.g. ``GET /api/v1/nodes/x: nodes "x" not found``. Standard library only, so core
modules may catch these without loading an HTTP client.
"""

from __future__ import annotations


class ApiError(Exception):
    """A request to the API server failed. ``status`` is None when no response came back."""

    def __init__(
        self, message: str, *, status: int | None = None, reason: str = "", request: str = ""
    ) -> None:
        super().__init__(f"{request}: {message}" if request else message)
        self.message = message
        self.status = status
        self.reason = reason  # the Status object's machine-readable reason, e.g. "AlreadyExists"


class ApiUnavailable(ApiError):
    """No answer, a timeout, 429 or a 5xx: the API server may come back, retry with backoff."""


class NotFound(ApiError):
    """404: the object (or the Node we need as owner) does not exist."""


class Conflict(ApiError):
    """409: stale resourceVersion, an object that already exists, or a failed precondition."""


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists: a create found an object of that name."""


class Gone(ApiError):
    """410: the resourceVersion a watch started from is too old; list again."""


def from_status(
    status: int | None, message: str, *, reason: str = "", request: str = ""
) -> ApiError:
    """The error for an HTTP status (None: the request got no response)."""
    kind: type[ApiError] = ApiError
    if status is None or status == 429 or status >= 500:
        kind = ApiUnavailable
    elif status == 404:
        kind = NotFound
    elif status == 409:
        kind = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 410:
        kind = Gone
    return kind(message, status=status, reason=reason, request=request)
