"""The API client over its urllib3 transport, against a scripted server in a thread (TLS, plain).

The server answers each path with exact bytes, so every framing is sent as written:
Content-Length, chunked with extensions and trailers, ``Connection: close``, HTTP/1.0 up to
EOF, several Warning headers, a watch whose events are split across chunks, large bodies, and
malformed answers (bytes after a body, Content-Length beside chunked coding, a Content-Length
that is no number or a huge one).

Cases: keep-alive reuse; the pool under concurrency (as many connections as requests at once,
up to POOL_CONNECTIONS kept, none waits); a pooled connection the server closed while idle;
a connection that breaks before the answer (GET retried once, POST not: it may have taken
effect); timeouts (not retried), refused connections and garbled answers as ``ApiUnavailable``;
a malformed answer is an error whose connection is never reused, and the next, unrelated GET
gets its own answer; a header that would inject a line is refused unsent; watches (split
events, left midway, stopped); proxies from the environment and a kubeconfig (CONNECT
tunnels), tls-server-name; a 401 answered by reading the credentials again, once.
"""

from __future__ import annotations

import json
import logging
import os
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

from dra_gpu.kube import credentials, errors
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.kube.transport import MAX_BODY, POOL_CONNECTIONS, Transport
from e2e.cluster import certs

OBJECT = {"metadata": {"name": "a", "uid": "u-1"}}
OTHER = {"metadata": {"name": "other"}}
BIG = {"items": "x" * (8 << 20)}  # a ResourceSlice list can be megabytes
EVENTS = [
    {"type": t, "object": {"metadata": {"name": n}}}
    for t, n in (("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "b"))
]
INJECTED = {"injected": True}


def _answer(body: bytes, *, status: str = "200 OK", headers: tuple[str, ...] = ()) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _head(*headers: str) -> bytes:
    return ("\r\n".join(["HTTP/1.1 200 OK", *headers]) + "\r\n\r\n").encode()


def _chunked(*chunks: bytes, trailers: tuple[str, ...] = (), head: bytes = b"") -> bytes:
    out = head or _head("Content-Type: application/json", "Transfer-Encoding: chunked")
    for i, chunk in enumerate(chunks):
        out += f"{len(chunk):x}{';ext=1' if i == 0 else ''}\r\n".encode() + chunk + b"\r\n"
    return out + b"0\r\n" + "".join(f"{t}\r\n" for t in trailers).encode() + b"\r\n"


OBJ = json.dumps(OBJECT).encode()
SLOW_WAIT_S = 10.0  # bounds a broken test only
WATCH = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)
BIG_BYTES = json.dumps(BIG).encode()
# A whole answer that a reader which keeps leftover bytes would take for the next request's.
SMUGGLED = _answer(json.dumps(INJECTED).encode())
# path -> (the bytes answered, whether the server keeps the connection afterwards)
ANSWERS: dict[str, tuple[bytes, bool]] = {
    "/length": (_answer(OBJ), True),
    "/other": (_answer(json.dumps(OTHER).encode()), True),
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
    # Malformed: the server keeps the connection, so a client that reused it would read what
    # follows as the next request's answer.
    "/bytes-after-body": (_answer(OBJ) + SMUGGLED, True),
    "/length-and-chunked": (
        _chunked(
            OBJ,
            head=_head("Content-Length: 5", "Transfer-Encoding: chunked"),
        )
        + SMUGGLED,
        True,
    ),
    "/superscript-length": (_head("Content-Length: ²") + OBJ + SMUGGLED, True),
    "/huge-length": (_head(f"Content-Length: {10**30}") + OBJ, True),
    "/beyond-max-length": (_head(f"Content-Length: {MAX_BODY + 1}") + OBJ, True),
    "/two-lengths": (_head("Content-Length: 2", f"Content-Length: {len(OBJ)}") + OBJ, True),
    "/gzip-chunked": (
        _chunked(OBJ, head=_head("Transfer-Encoding: gzip, chunked")) + SMUGGLED,
        True,
    ),
}
MALFORMED = [
    "/length-and-chunked",
    "/superscript-length",
    "/huge-length",
    "/beyond-max-length",
    "/two-lengths",
    "/gzip-chunked",
]


@dataclass
class Server:
    """A scripted HTTP/1.x server: each request path answers with ``ANSWERS[path]``."""

    url: str
    accepted: int = 0
    requests: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # the Authorization of each request
    valid_token: str = "t"  # /auth answers 401 to any other
    drop_next: bool = False  # close the connection at the next request, unanswered
    abandoned: threading.Event = field(default_factory=threading.Event)
    # /slow answers once this many /slow requests are open at once (or after SLOW_WAIT_S), so a
    # burst's requests all overlap however slowly a busy machine starts them.
    slow_together: int = 1 << 30  # alone, /slow waits SLOW_WAIT_S (the read-timeout case)
    _slow_open: int = 0
    _slow: threading.Condition = field(default_factory=threading.Condition)

    def wait_for_slow_burst(self) -> None:
        with self._slow:
            self._slow_open += 1
            self._slow.notify_all()
            self._slow.wait_for(lambda: self._slow_open >= self.slow_together, SLOW_WAIT_S)
        time.sleep(0.05)  # the last request's own answer is not first either

    def slow_done(self) -> None:
        with self._slow:
            self._slow_open -= 1

    def serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        with conn, rfile:
            while line := rfile.readline():
                method, target, _ = line.decode().split(" ", 2)
                length, auth = 0, ""
                while (header := rfile.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() == "authorization":
                        auth = value.strip()
                rfile.read(length)
                self.requests.append(f"{method} {target}")
                self.tokens.append(auth)
                if self.drop_next:
                    self.drop_next = False
                    return
                path = target.split("?")[0]
                if path == "/slow":
                    self.wait_for_slow_burst()
                    conn.sendall(_answer(OBJ))
                    self.slow_done()
                    continue
                if path == "/auth":
                    ok = auth == f"Bearer {self.valid_token}"
                    unauthorized = b'{"kind":"Status","reason":"Unauthorized","message":"no"}'
                    conn.sendall(
                        _answer(OBJ) if ok else _answer(unauthorized, status="401 Unauthorized")
                    )
                    continue
                if path == "/watch-forever":
                    conn.sendall(_chunked(WATCH[:-1])[: -len(b"0\r\n\r\n")])  # goes on
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


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's or CI's proxy variables must not reach the servers of these tests.
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


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
    listener = socket.create_server((host, 0), family=family, backlog=64)
    netloc = f"[{host}]" if ":" in host else host
    server = Server(f"{'https' if tls else 'http'}://{netloc}:{listener.getsockname()[1]}")
    threading.Thread(target=_run, args=(listener, server, tls), daemon=True).start()
    yield server
    listener.close()


@pytest.fixture
def client_tls(pki: certs.Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca.cert))


def make_client(
    url: str, tls: ssl.SSLContext | None, auth: credentials.Auth | None = None
) -> KubeClient:
    return KubeClient(Transport(url, ssl_context=tls), auth=auth or credentials.StaticToken("t"))


@pytest.fixture
def client(server: Server, client_tls: ssl.SSLContext) -> KubeClient:
    return make_client(server.url, client_tls)


# ----- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/length", "/chunked", "/close", "/http10", "/continue"])
def test_every_framing_reads_the_whole_body(client: KubeClient, path: str) -> None:
    assert client.request("GET", path) == OBJECT
    assert client.request("GET", path) == OBJECT  # the connection after it is usable or new


@pytest.mark.parametrize("path", ["/big", "/big-chunked"])
def test_large_bodies(client: KubeClient, path: str) -> None:
    assert client.request("GET", path) == BIG


def test_plain_http(plain_server: Server) -> None:
    client = make_client(plain_server.url, None)
    assert client.request("GET", "/chunked") == OBJECT
    assert client.request("POST", "/length", body={"a": 1}) == OBJECT
    assert plain_server.accepted == 1


def test_ipv6_literal_server(server_tls: ssl.SSLContext, client_tls: ssl.SSLContext) -> None:
    # An in-cluster client's KUBERNETES_SERVICE_HOST may be an IPv6 address.
    for server in _start(server_tls, "::1"):
        assert make_client(server.url, client_tls).request("GET", "/length") == OBJECT


def test_several_warning_headers_are_kept(client: KubeClient) -> None:
    assert client.call("GET", "/warnings").warnings == ("first", "second", "déjà vu")


def test_http_error_status_is_the_mapped_error_with_the_servers_message(
    client: KubeClient,
) -> None:
    with pytest.raises(errors.NotFound) as raised:
        client.request("GET", "/missing")
    assert (raised.value.status, raised.value.message) == (404, 'claims "c" not found')
    assert client.request("GET", "/length") == OBJECT  # an error answer leaves it usable


# ----- malformed answers -----------------------------------------------------------------------


def test_bytes_after_a_body_never_answer_the_next_request(
    client: KubeClient, server: Server
) -> None:
    assert client.request("GET", "/bytes-after-body") == OBJECT
    # Whether urllib3 dropped the extra bytes with the finished answer's buffer or found the
    # idle connection readable and replaced it, the next GET reads its own answer.
    assert client.request("GET", "/other") == OTHER
    assert server.requests[-1] == "GET /other"


@pytest.mark.parametrize("path", MALFORMED)
def test_a_malformed_answer_is_unavailable_and_its_connection_is_not_reused(
    client: KubeClient, server: Server, path: str
) -> None:
    with pytest.raises(errors.ApiUnavailable, match=r"Content-Length|Transfer-Encoding"):
        client.request("GET", path)
    assert client.request("GET", "/other") == OTHER
    assert server.accepted == 2  # the malformed answer's connection was closed


def test_a_malformed_watch_answer_is_unavailable(client: KubeClient, server: Server) -> None:
    with pytest.raises(errors.ApiUnavailable, match="Content-Length"):
        list(client.watch("/superscript-length", query={}, stop=threading.Event()))
    assert client.request("GET", "/other") == OTHER
    assert server.accepted == 2


# ----- connections -----------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection(client: KubeClient, server: Server) -> None:
    client.request("GET", "/length")
    client.request("GET", "/chunked")
    with pytest.raises(errors.NotFound):
        client.request("GET", "/missing")
    client.request("POST", "/length", body={"a": 1})
    assert len(server.requests) == 4
    assert server.accepted == 1


def _burst(client: KubeClient, count: int, server: Server) -> list[dict[str, Any]]:
    """``count`` GETs at once, each answered only once all are open."""
    server.slow_together = count
    answers: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: answers.append(client.request("GET", "/slow")))
        for _ in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_the_plugins_concurrency_keeps_every_connection(
    client: KubeClient, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    # 16 DRA calls at once, each with its claim GET, plus the publisher's request.
    caplog.set_level(logging.WARNING, logger="urllib3")
    assert _burst(client, 17, server) == [OBJECT] * 17
    assert _burst(client, 17, server) == [OBJECT] * 17
    assert server.accepted == 17  # the second burst reused the first one's connections
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


def test_beyond_the_pool_none_waits_and_only_those_kept_are_reused(
    client: KubeClient, server: Server
) -> None:
    extra = 2
    answers = _burst(client, POOL_CONNECTIONS + extra, server)
    assert answers == [OBJECT] * (POOL_CONNECTIONS + extra)
    assert server.accepted == POOL_CONNECTIONS + extra  # none waited for another's connection
    _burst(client, POOL_CONNECTIONS + extra, server)
    assert server.accepted == POOL_CONNECTIONS + 2 * extra  # the extra ones were closed


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
    with pytest.raises(errors.ApiUnavailable):
        client.request("POST", "/length", body={"a": 1})
    assert server.requests.count("POST /length") == 1


def test_a_read_timeout_is_unavailable_and_not_retried(client: KubeClient, server: Server) -> None:
    with pytest.raises(errors.ApiUnavailable, match="timed out"):
        client.request("GET", "/slow", timeout_s=0.2)
    assert server.requests == ["GET /slow"]


def test_connect_timeout_is_unavailable(client_tls: ssl.SSLContext) -> None:
    # A listener that never accepts: TCP connects (the kernel's backlog), TLS never answers.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        client = make_client(f"https://127.0.0.1:{silent.getsockname()[1]}", client_tls)
        with pytest.raises(errors.ApiUnavailable, match="timed out"):
            client.request("GET", "/length", timeout_s=0.2)


def test_refused_connection_is_unavailable(client_tls: ssl.SSLContext) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    client = make_client(f"https://127.0.0.1:{port}", client_tls)
    with pytest.raises(errors.ApiUnavailable, match="Connection refused"):
        client.request("GET", "/length")


def test_an_answer_that_is_not_http_is_unavailable(client: KubeClient) -> None:
    with pytest.raises(errors.ApiUnavailable):
        client.request("GET", "/garbage")


def test_a_header_that_would_inject_a_line_is_refused_unsent(
    server: Server, client_tls: ssl.SSLContext
) -> None:
    client = make_client(server.url, client_tls, credentials.StaticToken("t\r\nX-Admin: 1"))
    with pytest.raises(errors.ApiError, match="cannot send") as raised:
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


def test_a_watch_ends_at_its_stop_event(client: KubeClient, server: Server) -> None:
    stop = threading.Event()
    seen = []
    for event in client.watch("/watch-forever", query={}, stop=stop):
        seen.append(event)
        stop.set()  # the plugin stopping while events still arrive
    assert seen == EVENTS[:1]
    assert server.abandoned.wait(3)


# ----- proxies ---------------------------------------------------------------------------------


@dataclass
class Proxy:
    url: str
    heads: list[list[bytes]] = field(default_factory=list)  # each CONNECT's request lines


def _tunnel(listener: socket.socket, proxy: Proxy) -> None:
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
        lines = head.split(b"\r\n")[:-2]
        proxy.heads.append(lines)
        host, port = lines[0].split(b" ")[1].decode().rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=copy, args=(conn, upstream.dup()), daemon=True).start()
        threading.Thread(target=copy, args=(upstream, conn.dup()), daemon=True).start()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        running = Proxy(f"http://127.0.0.1:{listener.getsockname()[1]}")
        threading.Thread(target=_tunnel, args=(listener, running), daemon=True).start()
        yield running


def _kubeconfig(path: Path, pki: certs.Pki, cluster: dict[str, Any], user: Any = None) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"certificate-authority": str(pki.ca.cert), **cluster}}
        ],
        "users": [{"name": "u", "user": user or {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_https_proxy_from_the_environment_tunnels_with_connect(
    tmp_path: Path, pki: certs.Pki, server: Server, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://us%3Aer:pw@"))
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url})
    assert connect(config).request("GET", "/length") == OBJECT
    authority = server.url.removeprefix("https://")
    assert proxy.heads[0][0].startswith(f"CONNECT {authority} HTTP/1.".encode())
    headers = dict(line.split(b": ", 1) for line in proxy.heads[0][1:])
    assert {k.lower(): v for k, v in headers.items()}[b"proxy-authorization"] == (
        b"Basic dXM6ZXI6cHc="  # us:er:pw
    )
    assert server.requests == ["GET /length"]


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1", "*"])
def test_no_proxy_naming_the_host_goes_direct(
    tmp_path: Path,
    pki: certs.Pki,
    server: Server,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("no_proxy", no_proxy)
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url})
    assert connect(config).request("GET", "/length") == OBJECT
    assert proxy.heads == []
    assert server.requests == ["GET /length"]


@pytest.mark.parametrize("no_proxy", ["::1", "[::1]"])
def test_no_proxy_naming_an_ipv6_host_goes_direct(
    tmp_path: Path,
    pki: certs.Pki,
    server_tls: ssl.SSLContext,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    for server in _start(server_tls, "::1"):
        config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url})
        assert connect(config).request("GET", "/length") == OBJECT
    assert proxy.heads == []


def test_a_kubeconfig_proxy_tunnels_https_with_connect(
    tmp_path: Path, pki: certs.Pki, server: Server, proxy: Proxy
) -> None:
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url, "proxy-url": proxy.url})
    assert connect(config).request("GET", "/chunked") == OBJECT
    authority = server.url.removeprefix("https://")
    assert len(proxy.heads) == 1
    assert proxy.heads[0][0].startswith(f"CONNECT {authority} HTTP/1.".encode())
    assert server.requests == ["GET /chunked"]


def test_an_unusable_proxy_is_a_clear_error(
    tmp_path: Path, pki: certs.Pki, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url})
    with pytest.raises(errors.ApiError, match="proxy"):
        connect(config)


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


# ----- a 401 reads the credentials again -------------------------------------------------------


def test_a_rotated_token_file_is_read_again_after_a_401(
    tmp_path: Path, pki: certs.Pki, server: Server
) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url}, {"tokenFile": "token"})
    client = connect(config)
    server.valid_token = "new"
    # The file still holds the refused token: one request, and the 401 is the caller's.
    with pytest.raises(errors.ApiError) as raised:
        client.request("POST", "/auth", body={})
    assert (raised.value.status, raised.value.message) == (401, "no")
    assert server.tokens == ["Bearer old"]
    # The kubelet rotates the token within the minute the client would keep the old one.
    token.write_text("new\n")
    assert client.request("POST", "/auth", body={}) == OBJECT
    assert server.tokens[1:] == ["Bearer old", "Bearer new"]
    assert list(client.watch("/watch", query={}, stop=threading.Event())) == EVENTS
    assert server.tokens[-1] == "Bearer new"


def test_an_exec_plugin_runs_again_after_a_401(
    tmp_path: Path, pki: certs.Pki, server: Server
) -> None:
    # A kubeconfig only the official loader reads: its token comes from a command.
    token = tmp_path / "token"
    token.write_text("old")
    plugin = tmp_path / "get-token"
    credential = (
        '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"%s"}}'
    )
    plugin.write_text(f"#!/bin/sh\nprintf '{credential}' \"$(cat {token})\"\n")
    plugin.chmod(0o755)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    client = connect(_kubeconfig(tmp_path / "kc", pki, {"server": server.url}, user))
    server.valid_token = "new"
    token.write_text("new")
    assert client.request("GET", "/auth") == OBJECT
    assert server.tokens == ["Bearer old", "Bearer new"]


def test_the_plugins_api_path_does_not_load_the_official_client(
    tmp_path: Path, pki: certs.Pki, server: Server
) -> None:
    # The generated client is tens of MiB the kubelet plugin need not hold: its modules and a
    # plain kubeconfig's requests must not import it.
    config = _kubeconfig(tmp_path / "kc", pki, {"server": server.url})
    code = (
        "import sys, pathlib, threading\n"
        "from dra_gpu.plugin import main, node_plugin, current_devices, health_monitor\n"
        "from dra_gpu.kubeletplugin import events, slice_api\n"
        "from dra_gpu.prepare import claims\n"
        "from dra_gpu.kube import capabilities, client\n"
        f"c = client.connect(pathlib.Path({str(config)!r}))\n"
        "c.request('GET', '/length')\n"
        "list(c.watch('/watch', query={}, stop=threading.Event()))\n"
        "print('kubernetes' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"
    assert server.requests[0] == "GET /length"
