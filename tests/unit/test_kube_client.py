"""The shared API client and its credentials against an in-process HTTPS server (threads only).

Cases:
- credentials: a kubeconfig with embedded certificates authenticates by client certificate and
  checks the server against its CA; one with file paths (relative to the kubeconfig) and a token
  sends the token; a server signed by another CA is refused; auth methods and cluster settings
  we do not read go to the official loader; a kubeconfig naming a missing context is a clear
  error; the in-cluster service account; outside a cluster, the controller's fallback to
  ``$KUBECONFIG`` and the plugin's clear error; which file is the default kubeconfig.
- responses: HTTP statuses map to the error types (table, and end to end with the server's
  message); ``call`` returns the server's Warning headers, unescaped; a watch yields events and
  raises an ERROR event (410) as ``Gone``.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.kube import credentials, errors
from dra_gpu.kube.client import connect, parse_warnings
from e2e.cluster import certs

ADDED = {"type": "ADDED", "object": {"metadata": {"name": "a"}}}
EXPIRED = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}
# path -> (status, Status reason, message)
FAILURES = {
    "/missing": (404, "NotFound", 'nodes "x" not found'),
    "/exists": (409, "AlreadyExists", 'leases "l" already exists'),
    "/stale": (409, "Conflict", "the object has been modified"),
    "/down": (503, "ServiceUnavailable", "etcd is away"),
    "/invalid": (422, "Invalid", "spec.x: Required value"),
}


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's or CI's proxy variables must not reach the server of these tests.
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    directory = tmp_path_factory.mktemp("pki")
    return certs.create_pki(directory)


CONNECTIONS: list[int] = []  # one entry per connection the server accepted


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server does

    def setup(self) -> None:
        CONNECTIONS.append(1)
        super().setup()

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(0.2)  # long enough for every concurrent request to need a connection
            self._send(200, {})
        elif self.path in FAILURES:
            status, reason, message = FAILURES[self.path]
            self._send(status, {"kind": "Status", "reason": reason, "message": message})
        elif self.path.startswith("/watch"):
            self._watch()
        else:
            assert isinstance(self.connection, ssl.SSLSocket)
            peer = self.connection.getpeercert()
            subject = dict(x[0] for x in peer["subject"]) if peer else {}  # type: ignore[misc]
            self._send(
                200,
                {
                    "metadata": {"uid": "u-1"},
                    "cn": subject.get("commonName"),
                    "auth": self.headers.get("Authorization"),
                },
            )

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        warnings = ('299 - "first"', '299 - "say \\"hi\\""')
        self._send(201, json.loads(body), warnings=warnings)

    def _watch(self) -> None:
        self.close_connection = True  # the stream ends when the connection does
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        for event in (ADDED, EXPIRED):
            self.wfile.write(json.dumps(event).encode() + b"\n")
            self.wfile.flush()

    def _send(self, code: int, body: dict[str, Any], *, warnings: tuple[str, ...] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for warning in warnings:
            self.send_header("Warning", warning)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(pki: certs.Pki) -> Iterator[str]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.apiserver.cert, pki.apiserver.key)
    ctx.load_verify_locations(pki.ca.cert)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def write_config(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture
def token_config(tmp_path: Path, pki: certs.Pki, server: str) -> Path:
    return write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": b64(pki.ca.cert)},
        {"token": "t"},
    )


# ----- credentials --------------------------------------------------------------------------


def test_embedded_certificates(tmp_path: Path, pki: certs.Pki, server: str) -> None:
    config = write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": b64(pki.ca.cert)},
        {
            "client-certificate-data": b64(pki.admin.cert),
            "client-key-data": b64(pki.admin.key),
        },
    )
    answer = connect(config).request("GET", "/api/v1/nodes/n")
    assert answer["cn"] == "kubernetes-admin"
    assert answer["auth"] is None


def test_file_paths_relative_to_kubeconfig_and_token(
    tmp_path: Path, pki: certs.Pki, server: str
) -> None:
    (tmp_path / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    config = write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority": "ca.crt"},
        {"token": "secret-token"},
    )
    answer = connect(config).request("GET", "/api/v1/nodes/n")
    assert answer["auth"] == "Bearer secret-token"
    assert answer["cn"] is None


def test_server_of_another_ca_is_refused(tmp_path: Path, server: str) -> None:
    other = certs.create_pki(tmp_path / "other")
    config = write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": b64(other.ca.cert)},
        {"token": "t"},
    )
    with pytest.raises(errors.ApiUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        connect(config).request("GET", "/api/v1/nodes/n")


@pytest.mark.parametrize(
    ("cluster_fields", "user"),
    [
        pytest.param({}, {"exec": {"command": "get-token"}}, id="exec"),
        pytest.param({}, {"auth-provider": {"name": "oidc"}}, id="auth-provider"),
        pytest.param({}, {"username": "a", "password": "b"}, id="basic"),
        pytest.param({"proxy-url": "http://proxy:3128"}, {"token": "t"}, id="proxy"),
        pytest.param({"tls-server-name": "api"}, {"token": "t"}, id="tls-server-name"),
        pytest.param({"server": "http://127.0.0.1:1"}, {"token": "t"}, id="plain-http"),
    ],
)
def test_other_settings_go_to_the_official_loader(
    tmp_path: Path, cluster_fields: dict[str, Any], user: dict[str, Any]
) -> None:
    cluster = {"server": "https://127.0.0.1:1", **cluster_fields}
    config = write_config(tmp_path / "kc", cluster, user)
    with pytest.raises(credentials.Unsupported):
        credentials.from_kubeconfig(config)


def test_missing_context_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "kc"
    config.write_text(yaml.safe_dump({"current-context": "nope", "contexts": []}))
    with pytest.raises(errors.ApiError, match="no context named 'nope'"):
        connect(config)


def test_in_cluster_service_account(tmp_path: Path, pki: certs.Pki) -> None:
    (tmp_path / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    (tmp_path / "token").write_text("sa-token\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = credentials.in_cluster(env, tmp_path)
    assert creds.host == "https://[fd00::1]:443"
    assert creds.auth.headers() == {"Authorization": "Bearer sa-token"}


def test_outside_a_cluster_without_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(credentials.CredentialsError, match="pass --kubeconfig"):
        credentials.in_cluster({}, tmp_path)


def test_outside_a_cluster_the_default_kubeconfig_is_used_only_when_asked(
    token_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(token_config))
    answer = connect(None, default_kubeconfig=True).request("GET", "/api/v1/nodes/n")
    assert answer["auth"] == "Bearer t"
    with pytest.raises(errors.ApiError, match="pass --kubeconfig"):
        connect(None)


@pytest.mark.parametrize(
    ("kubeconfig", "expected"),
    [
        pytest.param("/etc/kc", Path("/etc/kc"), id="one-file"),
        pytest.param(f"/a{os.pathsep}/b", None, id="several-files-merged-elsewhere"),
        pytest.param("", Path.home() / ".kube" / "config", id="unset"),
    ],
)
def test_default_kubeconfig(kubeconfig: str, expected: Path | None) -> None:
    assert credentials.default_kubeconfig({"KUBECONFIG": kubeconfig}) == expected


# ----- responses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        pytest.param(None, "", errors.ApiUnavailable, id="no-response"),
        pytest.param(429, "TooManyRequests", errors.ApiUnavailable, id="429"),
        pytest.param(503, "ServiceUnavailable", errors.ApiUnavailable, id="503"),
        pytest.param(404, "NotFound", errors.NotFound, id="404"),
        pytest.param(409, "Conflict", errors.Conflict, id="409-conflict"),
        pytest.param(409, "AlreadyExists", errors.AlreadyExists, id="409-already-exists"),
        pytest.param(410, "Expired", errors.Gone, id="410"),
        pytest.param(422, "Invalid", errors.ApiError, id="422"),
        pytest.param(403, "Forbidden", errors.ApiError, id="403"),
    ],
)
def test_status_maps_to_error_type(
    status: int | None, reason: str, expected: type[errors.ApiError]
) -> None:
    err = errors.from_status(status, "msg", reason=reason, request="GET /x")
    assert type(err) is expected
    assert (str(err), err.message, err.status, err.reason) == ("GET /x: msg", "msg", status, reason)


@pytest.mark.parametrize("path", FAILURES)
def test_http_errors_carry_the_servers_message(token_config: Path, path: str) -> None:
    status, reason, message = FAILURES[path]
    with pytest.raises(errors.ApiError) as raised:
        connect(token_config).request("GET", path)
    err = raised.value
    assert type(err) is type(errors.from_status(status, "", reason=reason))
    assert (err.status, err.reason, err.message) == (status, reason, message)
    assert str(err) == f"GET {path}: {message}"


def test_concurrent_requests_keep_their_connections(token_config: Path) -> None:
    # As many requests at once as the plugin's DRA server runs calls: the second burst reuses
    # the first one's connections instead of opening (and handshaking) new ones.
    client = connect(token_config)
    before = len(CONNECTIONS)
    for _ in range(2):
        threads = [
            threading.Thread(target=client.request, args=("GET", "/slow")) for _ in range(16)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(CONNECTIONS) - before == 16


def test_call_returns_the_servers_warnings(token_config: Path) -> None:
    reply = connect(token_config).call("POST", "/things", body={"name": "a"})
    assert reply.body == {"name": "a"}
    assert reply.warnings == ("first", 'say "hi"')


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(['299 - "plain"'], ("plain",), id="plain"),
        pytest.param(['299 - "say \\"hi\\""', '299 - "b"'], ('say "hi"', "b"), id="escaped"),
        pytest.param(["odd"], ("odd",), id="unparsed-kept"),
    ],
)
def test_warning_headers(headers: list[str], expected: tuple[str, ...]) -> None:
    assert parse_warnings(headers) == expected


def test_watch_yields_events_and_raises_an_expired_version_as_gone(token_config: Path) -> None:
    seen = []
    with pytest.raises(errors.Gone, match="too old"):
        for event in connect(token_config).watch("/watch", query={}, stop=threading.Event()):
            seen.append(event)
    assert seen == [ADDED]
