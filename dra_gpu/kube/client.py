"""JSON requests and watches against one API server, over a urllib3 pool.

Design:
- Bodies stay plain dicts: the plugin builds ResourceSlices as dicts, and the controller compares
  exactly what the server stored (including fields a client release may not model). Nothing is
  deserialized into client model classes, and the same code works across API server versions.
- Credentials come from :mod:`credentials`; only a kubeconfig it leaves ``Unsupported`` loads
  the official client, lazily (:func:`connect`).
- Every failure leaves this module as an :mod:`errors` type: HTTP statuses and watch ERROR
  events are mapped by ``errors.from_status``; connection errors and timeouts are
  ``ApiUnavailable``. urllib3 does not retry by itself: the callers' loops retry and log once.
- Every request has a timeout, so no thread hangs on a dead API server.
- :meth:`KubeClient.call` also returns the server's ``Warning`` headers (admission webhooks and
  deprecations speak through them); :meth:`KubeClient.request` is the body alone.
- Thread-safe like the urllib3 pool under it, which keeps :data:`POOL_CONNECTIONS` open.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3

from dra_gpu.kube import credentials, errors

JSON = dict[str, Any]
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 20.0
WATCH_SECONDS = 290
# How much longer than the server-side watch timeout we wait, so the server ends a healthy
# stream first.
WATCH_GRACE_S = 30.0
MESSAGE_LIMIT = 4000
# Connections kept per host. The kubelet plugin runs up to 16 DRA calls at once, each with a
# claim GET, beside its publisher's watch and writes: a smaller pool closes the connections it
# cannot keep, so every burst pays new TLS handshakes (CPU here and in the API server).
POOL_CONNECTIONS = 24


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

    def __init__(
        self, *, host: str, pool: urllib3.PoolManager, auth_headers: Callable[[], dict[str, str]]
    ) -> None:
        self._host = host.rstrip("/")
        self._pool = pool
        self._auth_headers = auth_headers

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Mapping[str, Any] | None,
        timeout: urllib3.Timeout,
        stream: bool,
    ) -> urllib3.BaseHTTPResponse:
        url = self._host + path + (f"?{urlencode(query)}" if query else "")
        try:
            headers = {"Accept": "application/json", **self._auth_headers()}
        except credentials.CredentialsError as err:
            raise errors.ApiError(str(err), request=f"{method} {path}") from err
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        try:
            resp = self._pool.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=timeout,
                retries=False,
                preload_content=not stream,
            )
            if 200 <= resp.status < 300:
                return resp
            raw = resp.data if not stream else resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.ApiUnavailable(str(err), request=f"{method} {path}") from err
        if stream:
            resp.release_conn()
        raise _error(resp.status, raw, request=f"{method} {path}")

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Reply:
        """One request: the decoded JSON answer and the server's warnings, or an ApiError."""
        timeout = urllib3.Timeout(connect=min(CONNECT_TIMEOUT_S, timeout_s), read=timeout_s)
        resp = self._send(method, path, query=query, body=body, timeout=timeout, stream=False)
        try:
            decoded = json.loads(resp.data or b"{}")
        except ValueError as err:
            raise errors.ApiError("response is not JSON", request=f"{method} {path}") from err
        if not isinstance(decoded, dict):
            raise errors.ApiError("response is not a JSON object", request=f"{method} {path}")
        return Reply(decoded, parse_warnings(resp.headers.getlist("Warning")))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> JSON:
        """One request: the decoded JSON answer, or an ApiError."""
        return self.call(method, path, query=query, body=body, timeout_s=timeout_s).body

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
        """
        query = {**query, "watch": "true", "timeoutSeconds": str(timeout_s)}
        timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=timeout_s + WATCH_GRACE_S)
        resp = self._send("GET", path, query=query, body=None, timeout=timeout, stream=True)
        buffer = b""
        try:
            for chunk in resp.stream(4096, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if stop.is_set():
                        return
                    if line.strip():
                        yield _event(line, path)
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.ApiUnavailable(str(err), request=f"watch {path}") from err
        finally:
            resp.release_conn()

    def close(self) -> None:
        """Close the pooled connections (a later request opens new ones)."""
        self._pool.clear()


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
    ``errors.ApiError`` whose message names the file or variable.
    """
    try:
        if kubeconfig is None:
            try:
                return _from_credentials(credentials.in_cluster())
            except credentials.CredentialsError as err:
                if not default_kubeconfig:
                    raise
                kubeconfig = credentials.default_kubeconfig()
                if kubeconfig is None:  # several files to merge: the official loader's job
                    return _connect_with_official_loader(None)
                if not kubeconfig.exists():
                    raise credentials.CredentialsError(f"{err}; and no {kubeconfig}") from err
        try:
            return _from_credentials(credentials.from_kubeconfig(kubeconfig))
        except credentials.Unsupported:
            return _connect_with_official_loader(kubeconfig)
    except credentials.CredentialsError as err:
        raise errors.ApiError(str(err)) from err


def _from_credentials(creds: credentials.Credentials) -> KubeClient:
    pool = urllib3.PoolManager(num_pools=2, maxsize=POOL_CONNECTIONS, ssl_context=creds.ssl_context)
    return KubeClient(host=creds.host, pool=pool, auth_headers=creds.auth_headers)


def _connect_with_official_loader(kubeconfig: Path | None) -> KubeClient:
    from kubernetes import client as kclient  # heavy: only for exotic kubeconfigs
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    source = str(kubeconfig) if kubeconfig is not None else "$KUBECONFIG"
    try:
        kconfig.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None,
            client_configuration=cfg,
        )
    except Exception as err:  # the loader raises assorted types for one cause: bad config
        raise errors.ApiError(f"cannot load credentials from {source}: {err}") from err
    tls: dict[str, Any] = {
        "cert_reqs": "CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
        "ca_certs": cfg.ssl_ca_cert,
        "cert_file": cfg.cert_file,
        "key_file": cfg.key_file,
        "server_hostname": cfg.tls_server_name,
    }
    pool: urllib3.PoolManager
    if cfg.proxy:
        pool = urllib3.ProxyManager(
            str(cfg.proxy),
            num_pools=2,
            maxsize=POOL_CONNECTIONS,
            proxy_headers=cfg.proxy_headers,
            **tls,
        )
    else:
        pool = urllib3.PoolManager(num_pools=2, maxsize=POOL_CONNECTIONS, **tls)

    def auth_headers() -> dict[str, str]:
        # auth_settings() runs the loader's refresh hook, so rotated tokens are picked up.
        settings: Any = cfg.auth_settings()
        return {
            str(s["key"]): str(s["value"])
            for s in settings.values()
            if s.get("in") == "header" and s.get("value")
        }

    return KubeClient(host=str(cfg.host), pool=pool, auth_headers=auth_headers)
