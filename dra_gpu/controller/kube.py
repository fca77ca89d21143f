"""JSON requests to the API server over the kubernetes client's connection and credentials.

The controller works on raw JSON objects (dicts) rather than the client's generated models:
drift detection compares exactly what the server stored, including fields a given client
release may not model, and the same code works across API server versions. This module is the
only one in the controller that imports the kubernetes client.

Errors map to a small hierarchy by HTTP status (:class:`NotFound`, :class:`Conflict`, else
:class:`ApiError`), each carrying the server's own message.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

JSON = dict[str, Any]
log = logging.getLogger(__name__)


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, message: str, *, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: a stale resourceVersion on update, or the object already exists on create."""


def _error(status: int, data: bytes) -> ApiError:
    message, reason = data.decode("utf-8", "replace")[:2000], ""
    try:
        body = json.loads(data)
        message, reason = str(body.get("message", message)), str(body.get("reason", ""))
    except (ValueError, AttributeError):
        pass
    cls = {404: NotFound, 409: Conflict}.get(status, ApiError)
    return cls(status, message, reason=reason)


@dataclass(frozen=True)
class Reply:
    body: JSON
    warnings: tuple[str, ...]  # texts of the response's ``Warning: 299 - "..."`` headers


_WARNING = re.compile(r'^\s*299\s+\S+\s+"(?P<text>(?:[^"\\]|\\.)*)"')


def _warnings(headers: list[str]) -> tuple[str, ...]:
    out = []
    for header in headers:
        match = _WARNING.match(header)
        out.append(match["text"].replace('\\"', '"').replace("\\\\", "\\") if match else header)
    return tuple(out)


class Kube:
    """A JSON view of one API server; thread-safe like the underlying urllib3 pool."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self._api = api_client

    @classmethod
    def connect(cls, kubeconfig: str | None) -> Kube:
        """From a kubeconfig file, else in-cluster credentials, else the default kubeconfig."""
        if kubeconfig:
            return cls(k8s_config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(k8s_client.ApiClient())

    @property
    def api_client(self) -> k8s_client.ApiClient:
        return self._api

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Mapping[str, Any] | None,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        try:
            return self._api.call_api(*request, _request_timeout=timeout)
        except k8s_client.ApiException as exc:  # transport-level failure (TLS, refused)
            raise ApiError(int(exc.status or 0), str(exc.reason)) from exc
        except OSError as exc:
            raise ApiError(0, str(exc)) from exc

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        """One request; the decoded JSON answer and the server's warnings, or an ApiError."""
        try:
            response = self._send(method, path, query=query, body=body, timeout=timeout)
            data: bytes = response.read()
        except ApiError:
            raise
        except Exception as exc:  # urllib3 raises its own hierarchy for timeouts and resets
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status <= 299:
            raise _error(response.status, data)
        decoded = json.loads(data) if data else {}
        body_out = decoded if isinstance(decoded, dict) else {"value": decoded}
        return Reply(body_out, _warnings(response.headers.getlist("Warning")))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> JSON:
        """One request; the decoded JSON answer, or an :class:`ApiError`."""
        return self.call(method, path, query=query, body=body, timeout=timeout).body

    def watch(self, path: str, *, query: Mapping[str, str], timeout_s: int) -> Iterator[JSON]:
        """Watch events (``{"type": ..., "object": ...}``) until the server ends the stream."""
        params = {**query, "watch": "true", "timeoutSeconds": str(timeout_s)}
        response = self._send(
            "GET", path, query=params, body=None, timeout=(10.0, timeout_s + 10.0)
        )
        raw = response.response
        try:
            if not 200 <= response.status <= 299:
                raise _error(response.status, raw.read())
            buffer = b""
            for chunk in raw.stream(64 * 1024, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            raw.release_conn()
