"""Thin Kubernetes API I/O for the kubelet plugin: JSON in, JSON out, over urllib3.

Design:
- Credentials come from ``kubecreds`` (service account, or a kubeconfig with certificates or a
  token); only a kubeconfig with another auth method loads the official client, lazily.
  Requests go straight through a urllib3 pool with that TLS setup, bodies stay plain dicts
  (ResourceSlices are built as dicts), and nothing is deserialized into client model classes.
- Every failure leaves this module as an ``apierrors`` type: HTTP statuses are mapped by
  ``apierrors.from_status``; connection errors and timeouts become ``ApiUnavailable``.
- ``SliceApi`` implements ``publisher.SliceStore`` for one node and driver; its list and watch
  use the field selector ``spec.nodeName=<node>,spec.driver=<driver>``.
- Every request has a timeout, so no thread hangs on a dead API server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from dra_gpu.plugin import apierrors

JSON = dict[str, Any]
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
REQUEST_TIMEOUT = urllib3.Timeout(connect=5.0, read=20.0)
WATCH_SECONDS = 290
# Longer than the server-side watch timeout, so the server ends a healthy stream first.
WATCH_TIMEOUT = urllib3.Timeout(connect=5.0, read=WATCH_SECONDS + 30.0)


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
        query: dict[str, str] | None,
        body: JSON | None,
        timeout: urllib3.Timeout,
        stream: bool,
    ) -> urllib3.BaseHTTPResponse:
        url = self._host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", **self._auth_headers()}
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
        except urllib3.exceptions.HTTPError as err:
            raise apierrors.ApiUnavailable(f"{method} {path}: {err}") from err
        if not 200 <= resp.status < 300:
            text = resp.data.decode(errors="replace") if not stream else resp.read().decode()
            raise apierrors.from_status(resp.status, f"{method} {path}: {_message(text)}")
        return resp

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: JSON | None = None,
    ) -> JSON:
        resp = self._send(
            method, path, query=query, body=body, timeout=REQUEST_TIMEOUT, stream=False
        )
        try:
            result: JSON = json.loads(resp.data or b"{}")
        except ValueError as err:
            raise apierrors.ApiError(f"{method} {path}: response is not JSON") from err
        return result

    def watch(self, path: str, *, query: dict[str, str], stop: threading.Event) -> Iterator[JSON]:
        """Watch events (``{"type", "object"}``) until the server ends the stream."""
        query = {**query, "watch": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        resp = self._send("GET", path, query=query, body=None, timeout=WATCH_TIMEOUT, stream=True)
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
            raise apierrors.ApiUnavailable(f"watch {path}: {err}") from err
        finally:
            resp.release_conn()


def _message(text: str) -> str:
    try:
        status = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    return str(status.get("message") or text)[:500]


def _event(line: bytes, path: str) -> JSON:
    try:
        event: JSON = json.loads(line)
    except ValueError as err:
        raise apierrors.ApiUnavailable(f"watch {path}: garbled event") from err
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise apierrors.from_status(status.get("code"), f"watch {path}: {status.get('message')}")
    return event


def connect(kubeconfig: Path | None) -> KubeClient:
    """A client from a kubeconfig file, or from the in-cluster service account when None."""
    from dra_gpu.plugin import kubecreds

    try:
        if kubeconfig is None:
            creds = kubecreds.in_cluster()
        else:
            creds = kubecreds.from_kubeconfig(kubeconfig)
    except kubecreds.CredentialsError as err:
        raise apierrors.ApiError(str(err)) from err
    except kubecreds.Unsupported:
        assert kubeconfig is not None
        return _connect_with_official_loader(kubeconfig)
    pool = urllib3.PoolManager(num_pools=2, maxsize=4, ssl_context=creds.ssl_context)
    return KubeClient(host=creds.host, pool=pool, auth_headers=creds.auth_headers)


def _connect_with_official_loader(kubeconfig: Path) -> KubeClient:
    from kubernetes import client as kclient  # heavy: only for exotic kubeconfigs
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    try:
        kconfig.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=cfg
        )
    except Exception as err:  # the loader raises assorted types for one cause: bad config
        raise apierrors.ApiError(f"cannot load credentials from {kubeconfig}: {err}") from err
    pool = urllib3.PoolManager(
        num_pools=2,
        maxsize=4,
        cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
        ca_certs=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        server_hostname=cfg.tls_server_name,
    )

    def auth_headers() -> dict[str, str]:
        # auth_settings() runs the loader's refresh hook, so rotated tokens are picked up.
        settings: Any = cfg.auth_settings()
        return {
            str(s["key"]): str(s["value"])
            for s in settings.values()
            if s.get("in") == "header" and s.get("value")
        }

    return KubeClient(host=str(cfg.host), pool=pool, auth_headers=auth_headers)


class SliceApi:
    """``publisher.SliceStore`` over the API: this node's ResourceSlices of one driver."""

    def __init__(self, client: KubeClient, *, node: str, driver: str) -> None:
        self._client = client
        self._node = node
        self._selector = {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}

    def node_uid(self) -> str:
        node = self._client.request("GET", f"/api/v1/nodes/{quote(self._node)}")
        return str(node["metadata"]["uid"])

    def list_slices(self) -> list[JSON]:
        listed = self._client.request("GET", SLICES_PATH, query=self._selector)
        return list(listed.get("items") or [])

    def create_slice(self, body: JSON) -> None:
        self._client.request("POST", SLICES_PATH, body=body)

    def update_slice(self, body: JSON) -> None:
        name = body["metadata"]["name"]
        self._client.request("PUT", f"{SLICES_PATH}/{quote(name)}", body=body)

    def delete_slice(self, name: str, *, uid: str) -> None:
        # The UID precondition keeps us from deleting a slice that a peer just recreated.
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        self._client.request("DELETE", f"{SLICES_PATH}/{quote(name)}", body=options)

    def watch_slices(self, stop: threading.Event) -> Iterator[str]:
        for event in self._client.watch(SLICES_PATH, query=self._selector, stop=stop):
            yield str(event.get("type"))
