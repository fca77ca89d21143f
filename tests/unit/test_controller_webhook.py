"""The HTTPS layer of the webhook, with a generated CA, on loopback in this process.

Cases: a client trusting only the generated ca.crt completes TLS for 127.0.0.1 and gets the
review answer; keep-alive serves several reviews on one connection; bad bodies get 400, other
paths 404; a client that does not trust the CA fails without harming the server; generated
files are reused when still valid and keys are private; rotated files are picked up. Every
review gets an answer on the same connection: a body nested 985 or 5,000 levels deep is refused
saying so (64 levels are still checked), huge quantity exponents and an exception of the
reviewer are refused (the exception logged at ERROR with its traceback); an unclosed deep body
and a bad Content-Length get 400; brackets inside strings are not nesting.
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

from dra_gpu.controller import admission, bounded_json, certs, serving


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


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def deep_review(uid: str, depth: int) -> dict[str, Any]:
    deep = review(uid)
    config = deep["request"]["object"]["spec"]["devices"]["config"][0]
    config["opaque"]["parameters"] = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": nested(depth),
    }
    return deep


@pytest.mark.parametrize("depth", [985, 5000], ids=["985-levels", "5000-levels"])
def test_deeply_nested_review_is_refused_saying_so(
    server: tuple[serving.WebhookServer, certs.CertFiles], depth: int
) -> None:
    srv, files = server
    # json.dumps recurses like json.loads: the deep part is written by hand.
    deep = '{"a": ' * depth + '"x"' + "}" * depth
    body = json.dumps(deep_review("deep", 0)).replace('"x"', deep)
    conn = client(srv, files.ca)
    status, answer = post(conn, body.encode())
    assert status == 200
    response = json.loads(answer)["response"]
    assert response["uid"] == "deep" and response["allowed"] is False
    assert "nested more than 64 levels deep" in response["status"]["message"]
    # The same connection still serves.
    assert post(conn, json.dumps(review("after")).encode())[0] == 200
    conn.close()


def test_review_just_within_the_depth_bound_is_checked(
    server: tuple[serving.WebhookServer, certs.CertFiles],
) -> None:
    srv, files = server
    # review(8 levels to parameters) + sharing + nesting: 64 levels in all.
    status, answer = post(client(srv, files.ca), json.dumps(deep_review("ok", 53)).encode())
    message = json.loads(answer)["response"]["status"]["message"]
    assert status == 200
    assert "parameters.sharing.a: unknown field" in message


def test_unclosed_deep_body_is_a_bad_request(
    server: tuple[serving.WebhookServer, certs.CertFiles],
) -> None:
    srv, files = server
    assert post(client(srv, files.ca), b"[" * 5000)[0] == 400


@pytest.mark.parametrize("exponent", ["1e99999999", "1e9999999999999999999"], ids=["e8", "e19"])
def test_huge_quantity_exponent_gets_an_answer(
    server: tuple[serving.WebhookServer, certs.CertFiles], exponent: str
) -> None:
    srv, files = server
    huge = review("huge")
    huge["request"]["object"]["spec"]["devices"]["config"][0]["opaque"]["parameters"] = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": exponent}},
    }
    status, answer = post(client(srv, files.ca), json.dumps(huge).encode())
    assert status == 200
    response = json.loads(answer)["response"]
    assert response["uid"] == "huge" and response["allowed"] is False
    assert response["status"]["message"]


def test_reviewer_exception_is_refused_and_logged_with_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_review: Any) -> dict[str, Any]:
        raise ZeroDivisionError("boom")

    files = certs.ensure_self_signed(tmp_path / "certs")
    srv = serving.WebhookServer(
        host="127.0.0.1", port=0, context=certs.server_context(files), reviewer=broken
    )
    srv.start()
    try:
        with caplog.at_level("ERROR", logger="dra_gpu.controller.serving"):
            status, answer = post(client(srv, files.ca), json.dumps(review("oops")).encode())
    finally:
        srv.stop()
    response = json.loads(answer)["response"]
    assert status == 200 and response["uid"] == "oops" and response["allowed"] is False
    assert "internal error" in response["status"]["message"]
    assert "ZeroDivisionError" in response["status"]["message"]
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info is not None and "ResourceClaim" in record.getMessage()


def test_bad_content_length_is_a_bad_request(
    server: tuple[serving.WebhookServer, certs.CertFiles],
) -> None:
    srv, files = server
    conn = client(srv, files.ca)
    conn.putrequest("POST", "/validate")
    conn.putheader("Content-Length", "many")
    conn.endheaders()
    assert conn.getresponse().status == 400
    conn.close()


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"s": "[{" * 500 + '\\"[', "t": [[["x"]]]})
    decoded = bounded_json.loads(text, max_depth=4)
    assert decoded.cut is False and decoded.value["s"].startswith("[{[{")
    assert bounded_json.loads(text, max_depth=3) == bounded_json.Decoded(
        {"s": json.loads(text)["s"], "t": [[None]]}, cut=True
    )


def test_stopped_server_closes_kept_alive_connections(tmp_path: Path) -> None:
    files = certs.ensure_self_signed(tmp_path / "certs")
    srv = serving.WebhookServer(
        host="127.0.0.1", port=0, context=certs.server_context(files), reviewer=admission.review
    )
    srv.start()
    conn = client(srv, files.ca)
    assert post(conn, json.dumps(review("before")).encode())[0] == 200
    srv.stop()
    # Not answered by a server that was stopped (the API server would otherwise keep using it).
    with pytest.raises((ConnectionError, http.client.HTTPException, ssl.SSLError, OSError)):
        post(conn, json.dumps(review("after")).encode())
    conn.close()
