"""JSON requests and watches against one API server, over :mod:`transport` (urllib3).

Design:
- Bodies stay plain dicts: the plugin builds ResourceSlices as dicts, and the controller compares
  exactly what the server stored (including fields a client release may not model). Nothing is
  deserialized into client model classes, and the same code works across API server versions.
- Credentials come from :mod:`credentials` (``credentials.load``, which hands the kubeconfigs it
  does not read itself to the official client's loader, lazily); this module reads none.
- Every failure leaves this module as an :mod:`errors` type: HTTP statuses and watch ERROR
  events are mapped by ``errors.from_status``; connection errors, timeouts and malformed
  answers are ``ApiUnavailable``. The transport retries only a GET or HEAD whose connection
  broke; otherwise the callers' loops retry and log once.
- A 401 makes the credentials be read again now (a rotated service account token, the
  official loader's exec plugin) and, when they changed, the request is sent once more; a
  second 401 is the caller's.
- Every request has a timeout, so no thread hangs on a dead API server.
- :meth:`KubeClient.call` also returns the server's ``Warning`` headers (admission webhooks and
  deprecations speak through them); :meth:`KubeClient.request` is the body alone.
- Thread-safe like the pool under it (``transport.POOL_CONNECTIONS`` connections per server).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from dra_gpu.kube import credentials, errors
from dra_gpu.kube.transport import Answer, Stream, Transport, proxy_from_environment

JSON = dict[str, Any]
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 20.0
JSON_TYPE = "application/json"
# A server-side apply patch: the fields the caller owns, merged by the server per list-map key.
APPLY_PATCH = "application/apply-patch+yaml"
# A JSON merge patch: the keys given replace the object's, a null removes one (Node labels).
MERGE_PATCH = "application/merge-patch+json"
WATCH_SECONDS = 290
# How much longer than the server-side watch timeout we wait, so the server ends a healthy
# stream first.
WATCH_GRACE_S = 30.0
MESSAGE_LIMIT = 4000


def list_query(query: Mapping[str, str], *, consistent: bool = False) -> dict[str, str]:
    """A list's query: from the API server's watch cache (``resourceVersion=0``, as informers
    list: no wait for the cache to reach etcd's revision, no fallback to etcd, which cannot apply
    a field selector), or, when ``consistent``, as etcd has the objects now (no
    ``resourceVersion``: after a watch expired, the cache may be behind)."""
    return dict(query) if consistent else {**query, "resourceVersion": "0"}


@dataclass(frozen=True)
class Reply:
    body: JSON
    warnings: tuple[str, ...]  # texts of the response's ``Warning: 299 - "..."`` headers


_WARNING = re.compile(r'^\s*299\s+\S+\s+"(?P<text>(?:[^"\\]|\\.)*)"')


def parse_warnings(headers: Iterable[str]) -> tuple[str, ...]:
    """The texts of ``Warning`` header values; a value not in the 299 form is kept whole."""
    out = []
    for header in headers:
        match = _WARNING.match(header)
        out.append(match["text"].replace('\\"', '"').replace("\\\\", "\\") if match else header)
    return tuple(out)


class KubeClient:
    """An authenticated connection to one API server."""

    def __init__(self, transport: Transport, *, auth: credentials.Auth) -> None:
        self._transport = transport
        self._auth = auth

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = JSON_TYPE,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Reply:
        """One request: the decoded JSON answer and the server's warnings, or an ApiError.
        ``content_type``: the body's, e.g. :data:`APPLY_PATCH` (JSON is a subset of YAML)."""
        request = f"{method} {path}"
        fixed = {"Accept": "application/json"}
        if body is not None:
            fixed["Content-Type"] = content_type
        data = json.dumps(body).encode() if body is not None else None

        answer = self._answered(
            method, _target(path, query), fixed, data, timeout_s=timeout_s, request=request
        )
        try:
            decoded = json.loads(answer.body or b"{}")
        except ValueError as err:
            raise errors.ApiError("response is not JSON", request=request) from err
        if not isinstance(decoded, dict):
            raise errors.ApiError("response is not a JSON object", request=request)
        return Reply(decoded, parse_warnings(answer.warnings))

    def _answered(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        data: bytes | None,
        *,
        timeout_s: float,
        request: str,
    ) -> Answer:
        """One request with credentials, sent again once with renewed ones after a 401 (it
        comes before anything took effect, so any method may be); a 2xx answer or an ApiError."""

        def send(auth: dict[str, str]) -> Answer:
            return self._transport.request(
                method,
                target,
                {**headers, **auth},
                data,
                connect_s=min(CONNECT_TIMEOUT_S, timeout_s),
                read_s=timeout_s,
                request=request,
            )

        auth = self._auth_headers(request)
        answer = send(auth)
        if answer.status == 401 and (renewed := self._renewed(auth, request)) is not None:
            answer = send(renewed)
        if not 200 <= answer.status < 300:
            raise _error(answer.status, answer.body, request=request)
        return answer

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = JSON_TYPE,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> JSON:
        """One request: the decoded JSON answer, or an ApiError."""
        return self.call(
            method, path, query=query, body=body, content_type=content_type, timeout_s=timeout_s
        ).body

    def get_text(
        self,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        accept: str = "text/plain",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> str:
        """A GET whose answer is text, not JSON (a pod's ``/metrics`` through the API server's
        proxy); an ApiError otherwise. ``accept``: the Accept header to send; ``dra-gpu validate``
        reads a pod's log (``pods/NAME/log``) with ``*/*``."""
        request = f"GET {path}"
        answer = self._answered(
            "GET",
            _target(path, query),
            {"Accept": accept},
            None,
            timeout_s=timeout_s,
            request=request,
        )
        return answer.body.decode(errors="replace")

    def watch(
        self,
        path: str,
        *,
        query: Mapping[str, str],
        stop: threading.Event,
        timeout_s: int = WATCH_SECONDS,
    ) -> Iterator[JSON]:
        """Watch events (``{"type", "object"}``) until the server ends the stream or ``stop``.

        An ERROR event is raised as its error (``errors.Gone`` for an expired resourceVersion).
        A watch left midway closes its connection (the rest of the stream is never read).
        """
        request = f"watch {path}"
        target = _target(path, {**query, "watch": "true", "timeoutSeconds": str(timeout_s)})

        def start(auth: dict[str, str]) -> Stream:
            return self._transport.stream(
                target,
                {"Accept": "application/json", **auth},
                connect_s=CONNECT_TIMEOUT_S,
                read_s=timeout_s + WATCH_GRACE_S,
                request=request,
            )

        auth = self._auth_headers(request)
        stream = start(auth)
        if stream.status == 401 and (renewed := self._renewed(auth, request)) is not None:
            stream.read()
            stream.close()
            stream = start(renewed)
        try:
            if not 200 <= stream.status < 300:
                raise _error(stream.status, stream.read(), request=f"GET {path}")
            for line in stream.lines():
                if stop.is_set():
                    return
                if line.strip():
                    yield _event(line, path)
        finally:
            stream.close()

    def close(self) -> None:
        """Close the pooled connections (a later request opens new ones)."""
        self._transport.close()

    def _auth_headers(self, request: str) -> dict[str, str]:
        try:
            return self._auth.headers()
        except credentials.CredentialsError as err:
            raise errors.ApiError(str(err), request=request) from err

    def _renewed(self, sent: dict[str, str], request: str) -> dict[str, str] | None:
        """Credentials read again after a 401, or None when they are the ones just refused."""
        try:
            self._auth.renew()
        except credentials.CredentialsError as err:
            raise errors.ApiError(str(err), status=401, request=request) from err
        fresh = self._auth_headers(request)
        return fresh if fresh != sent else None


def _target(path: str, query: Mapping[str, str] | None) -> str:
    return path + (f"?{urlencode(query)}" if query else "")


def _error(status: int, data: bytes, *, request: str) -> errors.ApiError:
    text = data.decode(errors="replace")
    message, reason = text.strip(), ""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or message)
        reason = str(body.get("reason") or "")
    return errors.from_status(status, message[:MESSAGE_LIMIT], reason=reason, request=request)


def _event(line: bytes, path: str) -> JSON:
    try:
        event = json.loads(line)
    except ValueError as err:
        raise errors.ApiUnavailable("garbled event", request=f"watch {path}") from err
    if not isinstance(event, dict):
        raise errors.ApiUnavailable("garbled event", request=f"watch {path}")
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise errors.from_status(
            status.get("code"),
            str(status.get("message")),
            reason=str(status.get("reason") or ""),
            request=f"watch {path}",
        )
    return event


def connect(kubeconfig: Path | None, *, default_kubeconfig: bool = False) -> KubeClient:
    """A client from a kubeconfig file, or from the in-cluster service account when None.

    With ``default_kubeconfig``, a process outside a cluster falls back to the kubeconfig
    kubectl would read (``$KUBECONFIG``, else ``~/.kube/config``). Unreadable credentials are an
    ``errors.ApiError`` whose message names the file or variable (see ``credentials.load``).
    """
    try:
        creds = credentials.load(kubeconfig, kubectl_default=default_kubeconfig)
    except credentials.CredentialsError as err:
        raise errors.ApiError(str(err)) from err
    transport = Transport(
        creds.host,
        ssl_context=creds.ssl_context,
        server_hostname=creds.server_hostname,
        # The kubeconfig's proxy-url wins over the environment, as in kubectl.
        proxy=creds.proxy or proxy_from_environment(creds.host),
        proxy_headers=creds.proxy_headers,
    )
    return KubeClient(transport, auth=creds.auth)
