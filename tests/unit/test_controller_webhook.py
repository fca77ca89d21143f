"""The HTTPS layer of the webhook, with a generated CA, on loopback in this process.

Cases: a client trusting only the generated ca.crt completes TLS for 127.0.0.1 and gets the
review answer; keep-alive serves several reviews on one connection; bad bodies get 400, other
paths 404; a client that does not trust the CA fails without harming the server; generated
files are reused when still valid and keys are private; rotated files are picked up.
"""

from __future__ import annotations

import http.client
import json
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.controller import admission, certs, registration, serving


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[serving.WebhookServer, certs.CertFiles]]:
    files = certs.ensure_self_signed(tmp_path / "certs")
    srv = serving.WebhookServer(
        host="127.0.0.1", port=0, context=certs.server_context(files), reviewer=admission.review
    )
    srv.start()
    yield srv, files
    srv.stop()


def client(srv: serving.WebhookServer, ca: Path | None) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    return http.client.HTTPSConnection("127.0.0.1", srv.port, context=ctx, timeout=10)


def review(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "object": {
                "spec": {
                    "devices": {
                        "config": [
                            {
                                "opaque": {
                                    "driver": "gpu.nvidia.com",
                                    "parameters": {
                                        "apiVersion": "resource.nvidia.com/v1beta1",
                                        "kind": "GpuConfig",
                                        "bogus": 1,
                                    },
                                }
                            }
                        ]
                    }
                }
            },
        },
    }


def post(
    conn: http.client.HTTPSConnection, body: bytes, path: str = "/validate"
) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_review_over_tls_with_generated_ca(
    server: tuple[serving.WebhookServer, certs.CertFiles],
) -> None:
    srv, files = server
    conn = client(srv, files.ca)
    for uid in ("one", "two", "three"):  # same connection: keep-alive
        status, body = post(conn, json.dumps(review(uid)).encode())
        answer = json.loads(body)
        assert status == 200
        assert answer["response"]["uid"] == uid
        assert answer["response"]["allowed"] is False
        assert "parameters.bogus: unknown field" in answer["response"]["status"]["message"]
    conn.close()


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        pytest.param("/validate", b"{not json", 400, id="bad-json"),
        pytest.param("/validate", b"[1]", 400, id="not-object"),
        pytest.param("/elsewhere", b"{}", 404, id="path"),
    ],
)
def test_bad_requests(
    server: tuple[serving.WebhookServer, certs.CertFiles], path: str, body: bytes, status: int
) -> None:
    srv, files = server
    conn = client(srv, files.ca)
    assert post(conn, body, path)[0] == status
    conn.close()


def test_healthz(server: tuple[serving.WebhookServer, certs.CertFiles]) -> None:
    srv, files = server
    conn = client(srv, files.ca)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok"
    conn.close()


def test_untrusting_client_fails_server_survives(
    server: tuple[serving.WebhookServer, certs.CertFiles],
) -> None:
    srv, files = server
    with pytest.raises(ssl.SSLCertVerificationError):
        post(client(srv, None), b"{}")
    status, _ = post(client(srv, files.ca), json.dumps(review("after")).encode())
    assert status == 200


def test_generated_files_are_reused_and_private(tmp_path: Path) -> None:
    first = certs.ensure_self_signed(tmp_path)
    ca_pem = first.ca.read_bytes() if first.ca else b""
    second = certs.ensure_self_signed(tmp_path)
    assert second.ca is not None and second.ca.read_bytes() == ca_pem
    assert stat.S_IMODE(first.key.stat().st_mode) == 0o600
    other_hosts = certs.ensure_self_signed(tmp_path, hosts=["webhook.example.svc"])
    assert other_hosts.ca is not None and other_hosts.ca.read_bytes() != ca_pem


def test_rotated_certificate_is_reloaded(tmp_path: Path) -> None:
    files = certs.ensure_self_signed(tmp_path / "a")
    ctx = certs.ReloadingContext(files)
    assert ctx.maybe_reload() is False
    rotated = certs.ensure_self_signed(tmp_path / "b", hosts=["127.0.0.1", "rotated"])
    files.cert.write_bytes(rotated.cert.read_bytes())
    files.key.write_bytes(rotated.key.read_bytes())
    assert ctx.maybe_reload() is True


def test_registration_limits_namespaces_and_carries_ca() -> None:
    cfg = registration.validating_webhook_configuration(
        "x",
        registration.client_config_url("https://127.0.0.1:1/validate", ca_bundle_pem=b"PEM"),
        namespaces=["t1"],
    )
    claims, classes = cfg["webhooks"]
    assert claims["clientConfig"]["caBundle"] == "UEVN"
    assert claims["namespaceSelector"]["matchExpressions"][0]["values"] == ["t1"]
    assert claims["sideEffects"] == "None" and claims["failurePolicy"] == "Fail"
    # DeviceClasses the chart installs before the webhook runs must never be blocked.
    assert classes["rules"][0]["resources"] == ["deviceclasses"]
    assert classes["rules"][0]["scope"] == "Cluster" and classes["failurePolicy"] == "Ignore"
