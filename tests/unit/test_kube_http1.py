"""The API client's HTTP/1.1 transport against a scripted server in a thread (TLS and plain).

The server answers each path with exact bytes, so every framing the transport reads is sent as
written: Content-Length, chunked with extensions and trailers, ``Connection: close``, HTTP/1.0
up to EOF, several Warning headers, a watch whose events are split across chunks, large bodies.

Cases: keep-alive reuse; a pooled connection the server closed while idle (the next request,
even a POST, succeeds); a connection that breaks before the answer (GET retried once on a new
connection, POST not: it may have taken effect); connect (TLS handshake) and read timeouts,
refused connections and garbled answers as ``ApiUnavailable``; an HTTP error status as the
mapped error with the server's message; a watch left midway closes its connection; a header
value that would inject a line is refused before anything is sent; a proxy (CONNECT tunnel)
and tls-server-name from kubeconfigs the official loader reads; the plugin's API path loads
neither urllib3 nor the official client.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.kube import errors, http1
from dra_gpu.kube.client import KubeClient, connect
from e2e.cluster import certs

OBJECT = {"metadata": {"name": "a", "uid": "u-1"}}
BIG = {"items": "x" * (8 << 20)}  # a ResourceSlice list can be megabytes
EVENTS = [
    {"type": t, "object": {"metadata": {"name": n}}}
    for t, n in (("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "b"))
]


def _answer(body: bytes, *, status: str = "200 OK", headers: tuple[str, ...] = ()) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _chunked(*chunks: bytes, trailers: tuple[str, ...] = ()) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i, chunk in enumerate(chunks):
        out += f"{len(chunk):x}{';ext=1' if i == 0 else ''}\r\n".encode() + chunk + b"\r\n"
    return out + b"0\r\n" + "".join(f"{t}\r\n" for t in trailers).encode() + b"\r\n"


OBJ = json.dumps(OBJECT).encode()
WATCH = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)
BIG_BYTES = json.dumps(BIG).encode()
# path -> (the bytes answered, whether the server keeps the connection afterwards)
ANSWERS: dict[str, tuple[bytes, bool]] = {
    "/length": (_answer(OBJ), True),
    "/chunked": (_chunked(OBJ[:7], OBJ[7:], trailers=("X-Checksum: 1",)), True),
    "/close": (_answer(OBJ, headers=("Connection: close",)), False),
    "/continue": (b"HTTP/1.1 100 Continue\r\n\r\n" + _answer(OBJ), True),
    "/http10": (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + OBJ, False),
    "/then-close": (_answer(OBJ), False),  # looks keep-alive, then the server closes it
    "/missing": (
        _answer(
            b'{"kind":"Status","reason":"NotFound","message":"claims \\"c\\" not found"}',
            status="404 Not Found",
        ),
        True,
    ),
    "/warnings": (
        _answer(
            OBJ,
            headers=(
                'Warning: 299 - "first"',
                'Warning: 299 - "second"',
                'Warning: 299 - "déjà vu"',
            ),
        ),
        True,
    ),
    "/watch": (_chunked(WATCH[:20], WATCH[20:90], WATCH[90:]), True),
    "/big": (_answer(BIG_BYTES), True),
    "/big-chunked": (
        _chunked(*(BIG_BYTES[i : i + (1 << 20)] for i in range(0, len(BIG_BYTES), 1 << 20))),
        True,
    ),
    "/garbage": (b"SSH-2.0-OpenSSH\r\n\r\n", False),
}


@dataclass
class Server:
    """A scripted HTTP/1.x server: each request path answers with ``ANSWERS[path]``."""

    url: str
    accepted: int = 0
    requests: list[str] = field(default_factory=list)
    drop_next: bool = False  # close the connection at the next request, unanswered
    abandoned: threading.Event = field(default_factory=threading.Event)

    def serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        with conn, rfile:
            while line := rfile.readline():
                method, target, _ = line.decode().split(" ", 2)
                length = 0
                while (header := rfile.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                rfile.read(length)
                self.requests.append(f"{method} {target}")
                if self.drop_next:
                    self.drop_next = False
                    return
                path = target.split("?")[0]
                if path == "/slow":
                    time.sleep(0.5)
                    conn.sendall(_answer(OBJ))
                    continue
                if path == "/watch-forever":
                    first = WATCH[: WATCH.index(b"\n") + 1]
                    conn.sendall(_chunked(first)[: -len(b"0\r\n\r\n")])  # stream goes on
                    self._wait_for_close(conn)
                    return
                if path == "/drop-next":
                    self.drop_next = True
                    path = "/length"
                data, keep = ANSWERS[path]
                conn.sendall(data)
                if not keep:
                    return

    def _wait_for_close(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            while conn.recv(1024):
                pass
        except TimeoutError:
            return  # the client kept the connection: not abandoned
        except (OSError, ssl.SSLError):
            pass  # reset, or closed without TLS close_notify: abandoned too
        self.abandoned.set()


def _run(listener: socket.socket, server: Server, tls: ssl.SSLContext | None) -> None:
    def handle(conn: socket.socket) -> None:
        try:
            server.serve(tls.wrap_socket(conn, server_side=True) if tls else conn)
        except (OSError, ssl.SSLError):
            conn.close()

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # listener closed
        server.accepted += 1
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.create_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server_tls(pki: certs.Pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.apiserver.cert, pki.apiserver.key)
    return ctx


@pytest.fixture
def server(server_tls: ssl.SSLContext) -> Iterator[Server]:
    yield from _start(server_tls)


@pytest.fixture
def plain_server() -> Iterator[Server]:
    yield from _start(None)


def _start(tls: ssl.SSLContext | None, host: str = "127.0.0.1") -> Iterator[Server]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, 0), family=family)
    netloc = f"[{host}]" if ":" in host else host
    server = Server(f"{'https' if tls else 'http'}://{netloc}:{listener.getsockname()[1]}")
    threading.Thread(target=_run, args=(listener, server, tls), daemon=True).start()
    yield server
    listener.close()


@pytest.fixture
def client_tls(pki: certs.Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca.cert))


def make_client(server: Server, tls: ssl.SSLContext | None) -> KubeClient:
    pool = http1.Pool(server.url, ssl_context=tls, keep=4)
    return KubeClient(pool, auth_headers=lambda: {"Authorization": "Bearer t"})


@pytest.fixture
def client(server: Server, client_tls: ssl.SSLContext) -> KubeClient:
    return make_client(server, client_tls)


# ----- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/length", "/chunked", "/close", "/http10", "/continue"])
def test_every_framing_reads_the_whole_body(client: KubeClient, path: str) -> None:
    assert client.request("GET", path) == OBJECT
    assert client.request("GET", path) == OBJECT  # the connection after it is usable or new


@pytest.mark.parametrize("path", ["/big", "/big-chunked"])
def test_large_bodies(client: KubeClient, path: str) -> None:
    assert client.request("GET", path) == BIG


def test_plain_http(plain_server: Server) -> None:
    client = make_client(plain_server, None)
    assert client.request("GET", "/chunked") == OBJECT
    assert client.request("POST", "/length", body={"a": 1}) == OBJECT
    assert plain_server.accepted == 1


def test_ipv6_literal_server(server_tls: ssl.SSLContext, client_tls: ssl.SSLContext) -> None:
    # An in-cluster client's KUBERNETES_SERVICE_HOST may be an IPv6 address.
    for server in _start(server_tls, "::1"):
        assert make_client(server, client_tls).request("GET", "/length") == OBJECT


def test_several_warning_headers_are_kept(client: KubeClient) -> None:
    assert client.call("GET", "/warnings").warnings == ("first", "second", "déjà vu")


def test_http_error_status_is_the_mapped_error_with_the_servers_message(
    client: KubeClient,
) -> None:
    with pytest.raises(errors.NotFound) as raised:
        client.request("GET", "/missing")
    assert (raised.value.status, raised.value.message) == (404, 'claims "c" not found')
    assert client.request("GET", "/length") == OBJECT  # an error answer leaves it usable


# ----- connections -----------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection(client: KubeClient, server: Server) -> None:
    client.request("GET", "/length")
    client.request("GET", "/chunked")
    with pytest.raises(errors.NotFound):
        client.request("GET", "/missing")
    client.request("POST", "/length", body={"a": 1})
    assert len(server.requests) == 4
    assert server.accepted == 1


def test_more_connections_than_kept_may_be_open_and_only_those_kept_are_reused(
    server: Server, client_tls: ssl.SSLContext
) -> None:
    client = KubeClient(http1.Pool(server.url, ssl_context=client_tls, keep=2), auth_headers=dict)
    answers: list[dict[str, Any]] = []

    def burst() -> None:
        threads = [
            threading.Thread(target=lambda: answers.append(client.request("GET", "/slow")))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    burst()
    assert server.accepted == 4  # none waits for another's connection
    burst()
    assert server.accepted == 6  # two were kept, two are new
    assert answers == [OBJECT] * 8


def test_connection_close_and_http10_are_not_reused(client: KubeClient, server: Server) -> None:
    client.request("GET", "/close")
    client.request("GET", "/http10")
    client.request("GET", "/length")
    assert server.accepted == 3


def test_a_connection_the_server_closed_while_idle_is_not_used(
    client: KubeClient, server: Server
) -> None:
    client.request("GET", "/then-close")
    time.sleep(0.1)  # the server's close arrives while the connection sits in the pool
    # A POST is never retried, so it succeeds only if the closed connection was left out.
    assert client.request("POST", "/length", body={"a": 1}) == OBJECT
    assert server.accepted == 2


def test_a_get_broken_before_its_answer_is_retried_once_on_a_new_connection(
    client: KubeClient, server: Server
) -> None:
    client.request("GET", "/drop-next")
    assert client.request("GET", "/length") == OBJECT
    assert server.requests[-2:] == ["GET /length", "GET /length"]
    assert server.accepted == 2


def test_a_post_broken_before_its_answer_is_not_sent_again(
    client: KubeClient, server: Server
) -> None:
    client.request("GET", "/drop-next")
    with pytest.raises(errors.ApiUnavailable, match="closed the connection"):
        client.request("POST", "/length", body={"a": 1})
    assert server.requests.count("POST /length") == 1


def test_read_timeout_is_unavailable(client: KubeClient) -> None:
    with pytest.raises(errors.ApiUnavailable, match=r"no answer from .* within 0.2 s"):
        client.request("GET", "/slow", timeout_s=0.2)


def test_connect_timeout_is_unavailable(client_tls: ssl.SSLContext) -> None:
    # A listener that never accepts: TCP connects (the kernel's backlog), TLS never answers.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        client = KubeClient(http1.Pool(url, ssl_context=client_tls), auth_headers=dict)
        with pytest.raises(errors.ApiUnavailable, match=r"no TLS handshake .* within 0.2 s"):
            client.request("GET", "/length", timeout_s=0.2)


def test_refused_connection_is_unavailable(client_tls: ssl.SSLContext) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    client = KubeClient(
        http1.Pool(f"https://127.0.0.1:{port}", ssl_context=client_tls), auth_headers=dict
    )
    with pytest.raises(errors.ApiUnavailable, match=f"cannot connect to 127.0.0.1:{port}"):
        client.request("GET", "/length")


def test_an_answer_that_is_not_http_is_unavailable(client: KubeClient) -> None:
    with pytest.raises(errors.ApiUnavailable, match=r"not an HTTP/1\.x status line"):
        client.request("GET", "/garbage")


def test_a_header_that_would_inject_a_line_is_refused_unsent(
    server: Server, client_tls: ssl.SSLContext
) -> None:
    pool = http1.Pool(server.url, ssl_context=client_tls)
    client = KubeClient(pool, auth_headers=lambda: {"Authorization": "Bearer t\r\nX-Admin: 1"})
    with pytest.raises(errors.ApiError, match="line break") as raised:
        client.request("GET", "/length")
    assert not isinstance(raised.value, errors.ApiUnavailable)  # retrying cannot help
    assert server.requests == []


# ----- watches ---------------------------------------------------------------------------------


def test_watch_reads_events_split_across_chunks_and_keeps_the_connection(
    client: KubeClient, server: Server
) -> None:
    assert list(client.watch("/watch", query={}, stop=threading.Event())) == EVENTS
    assert server.requests[-1] == "GET /watch?watch=true&timeoutSeconds=290"
    client.request("GET", "/length")
    assert server.accepted == 1


def test_a_watch_left_midway_closes_its_connection(client: KubeClient, server: Server) -> None:
    for event in client.watch("/watch-forever", query={}, stop=threading.Event()):
        assert event == EVENTS[0]
        break  # as a caller leaves a watch: the generator is closed when dropped
    assert server.abandoned.wait(3)
    client.request("GET", "/length")
    assert server.accepted == 2


# ----- settings the official loader reads ------------------------------------------------------


def _tunnel(listener: socket.socket, seen: list[bytes]) -> None:
    """A CONNECT proxy: one tunnel per accepted connection, bytes copied both ways."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        with src, dst:
            while data := src.recv(65536):
                dst.sendall(data)

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += conn.recv(1)
        seen.append(head.split(b"\r\n")[0])
        host, port = head.split(b" ")[1].decode().rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=copy, args=(conn, upstream.dup()), daemon=True).start()
        threading.Thread(target=copy, args=(upstream, conn.dup()), daemon=True).start()


def _kubeconfig(path: Path, pki: certs.Pki, cluster: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"certificate-authority": str(pki.ca.cert), **cluster}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_kubeconfig_proxy_tunnels_https_with_connect(
    tmp_path: Path, pki: certs.Pki, server: Server
) -> None:
    seen: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        threading.Thread(target=_tunnel, args=(listener, seen), daemon=True).start()
        proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
        config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url, "proxy-url": proxy})
        assert connect(config).request("GET", "/chunked") == OBJECT
    assert seen == [f"CONNECT {server.url.removeprefix('https://')} HTTP/1.1".encode()]
    assert server.requests == ["GET /chunked"]


def test_a_kubeconfig_tls_server_name_is_checked(
    tmp_path: Path, pki: certs.Pki, server: Server
) -> None:
    good = _kubeconfig(
        tmp_path / "good", pki, {"server": server.url, "tls-server-name": "kubernetes"}
    )
    assert connect(good).request("GET", "/length") == OBJECT
    bad = _kubeconfig(tmp_path / "bad", pki, {"server": server.url, "tls-server-name": "elsewhere"})
    with pytest.raises(errors.ApiUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        connect(bad).request("GET", "/length")


def test_the_plugins_api_path_loads_neither_urllib3_nor_the_official_client(
    tmp_path: Path, pki: certs.Pki, server: Server
) -> None:
    # urllib3 and the generated client are tens of MiB the kubelet plugin need not hold: its
    # modules and a plain kubeconfig's requests must not import them.
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url})
    code = (
        "import sys, pathlib, threading\n"
        "from dra_gpu.plugin import main, node_plugin, current_devices, health_monitor\n"
        "from dra_gpu.kubeletplugin import slice_api\n"
        "from dra_gpu.prepare import claims, events\n"
        "from dra_gpu.kube import capabilities, client\n"
        f"c = client.connect(pathlib.Path({str(config)!r}))\n"
        "c.request('GET', '/length')\n"
        "list(c.watch('/watch', query={}, stop=threading.Event()))\n"
        "print(sorted(m for m in ('urllib3', 'kubernetes') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
    assert server.requests[0] == "GET /length"
