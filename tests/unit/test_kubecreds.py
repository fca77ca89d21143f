"""API credentials and the thin client against an in-process HTTPS server (threads only).

Cases: a kubeconfig with embedded certificates authenticates by client certificate and checks
the server against its CA; one with file paths (relative to the kubeconfig) and a token sends the
token; a server signed by another CA is refused; auth methods we do not read go to the official
loader; a kubeconfig naming a missing context is a clear error; the in-cluster service account;
HTTP errors map to the publisher's error types.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.plugin import apierrors, kubeapi, kubecreds
from e2e import certs


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    directory = tmp_path_factory.mktemp("pki")
    return certs.create_pki(directory)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        peer = self.connection.getpeercert()  # type: ignore[attr-defined]
        subject = dict(x[0] for x in peer["subject"]) if peer else {}
        if self.path.startswith("/missing"):
            self._send(404, {"kind": "Status", "message": 'nodes "x" not found'})
            return
        self._send(
            200,
            {
                "metadata": {"uid": "u-1"},
                "cn": subject.get("commonName"),
                "auth": self.headers.get("Authorization"),
            },
        )

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
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


def test_embedded_certificates(tmp_path: Path, pki: certs.Pki, server: str) -> None:
    config = write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": b64(pki.ca.cert)},
        {
            "client-certificate-data": b64(pki.admin.cert),
            "client-key-data": b64(pki.admin.key),
        },
    )
    answer = kubeapi.connect(config).request("GET", "/api/v1/nodes/n")
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
    answer = kubeapi.connect(config).request("GET", "/api/v1/nodes/n")
    assert answer["auth"] == "Bearer secret-token"
    assert answer["cn"] is None


def test_server_of_another_ca_is_refused(tmp_path: Path, server: str) -> None:
    other = certs.create_pki(tmp_path / "other")
    config = write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": b64(other.ca.cert)},
        {"token": "t"},
    )
    with pytest.raises(apierrors.ApiUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        kubeapi.connect(config).request("GET", "/api/v1/nodes/n")


def test_http_errors_map_to_error_types(tmp_path: Path, pki: certs.Pki, server: str) -> None:
    config = write_config(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": b64(pki.ca.cert)},
        {"token": "t"},
    )
    with pytest.raises(apierrors.NotFound, match='nodes "x" not found'):
        kubeapi.connect(config).request("GET", "/missing")


@pytest.mark.parametrize(
    "user",
    [
        pytest.param({"exec": {"command": "get-token"}}, id="exec"),
        pytest.param({"auth-provider": {"name": "oidc"}}, id="auth-provider"),
        pytest.param({"username": "a", "password": "b"}, id="basic"),
    ],
)
def test_other_auth_methods_go_to_the_official_loader(tmp_path: Path, user: dict[str, Any]) -> None:
    config = write_config(tmp_path / "kc", {"server": "https://127.0.0.1:1"}, user)
    with pytest.raises(kubecreds.Unsupported):
        kubecreds.from_kubeconfig(config)


def test_missing_context_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "kc"
    config.write_text(yaml.safe_dump({"current-context": "nope", "contexts": []}))
    with pytest.raises(apierrors.ApiError, match="no context named 'nope'"):
        kubeapi.connect(config)


def test_in_cluster_service_account(tmp_path: Path, pki: certs.Pki) -> None:
    (tmp_path / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    (tmp_path / "token").write_text("sa-token\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = kubecreds.in_cluster(env, tmp_path)
    assert creds.host == "https://[fd00::1]:443"
    assert creds.auth_headers() == {"Authorization": "Bearer sa-token"}


def test_outside_a_cluster_without_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(kubecreds.CredentialsError, match="pass --kubeconfig"):
        kubecreds.in_cluster({}, tmp_path)
