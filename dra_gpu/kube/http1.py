"""HTTP/1.1 over persistent connections to one server: the API client's transport.

Why not urllib3 or http.client: the kubelet plugin GETs its claim on every prepare, and that
GET cost about 0.6-0.9 ms of CPU through urllib3 (0.3-0.4 ms through http.client) against
0.2-0.3 ms for one bytes write and hand parsing on the same TLS connection (bench/api_get.py),
most of that in the kernel and TLS. What the API server sends us is narrow:
JSON with a Content-Length, chunked watch streams, no compression (we send no
Accept-Encoding), so this reads exactly that and refuses what it does not understand.

- :class:`Pool` keeps up to ``keep`` idle connections (more may be open at once; the extra
  ones are closed when returned) and is thread-safe. Connections have TCP_NODELAY (a request is
  one write, its answer must not wait for an ACK).
- A connection the server closed while it sat idle is seen before reuse (the socket is
  readable: EOF). One that breaks anyway, before any byte of the answer, is retried once on a
  new connection for GET and HEAD only: a POST, PUT, PATCH or DELETE may have reached the
  server and taken effect before the connection broke, and sending it again could create or
  change an object twice. Callers retry those with what they know (AlreadyExists, Conflict).
- Bodies: Content-Length, chunked (trailers read and dropped), or up to EOF for a response
  with neither (HTTP/1.0); a connection is reused only after a complete HTTP/1.1 body without
  ``Connection: close``. A stream left before its end closes its connection.
- Failures are ``OSError``: ``TimeoutError`` (connect or read timeout), ``ConnectionError``
  (refused, reset, closed early, or :class:`ProtocolError` for an answer that is not HTTP/1.x),
  ``ssl.SSLError``; a request that cannot be sent as given is an :class:`InvalidRequest`.
- A proxy (``http://`` only) tunnels https with CONNECT; plain http goes to it in absolute form.
"""

from __future__ import annotations

import io
import select
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

MAX_LINE = 65536  # longest status or header line we read; the API server's are far shorter
MAX_HEADERS = 256
RETRIED = frozenset({"GET", "HEAD"})
STREAM_READ = 65536


class _Lines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


class ProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.x as this module reads it."""


class InvalidRequest(ValueError):
    """The request cannot be written as given (a line break in a header, a space in the path)."""


@dataclass(frozen=True)
class Timeouts:
    connect: float  # seconds for TCP connect and TLS handshake
    read: float  # seconds any one read of the answer may wait


@dataclass(frozen=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]  # (lower-case name, value) in order; repeats kept
    body: bytes

    def values(self, name: str) -> list[str]:
        """Every value of the header ``name`` (lower case), in the order sent."""
        return [value for key, value in self.headers if key == name]


class _Connection:
    __slots__ = ("reused", "rfile", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("rb")
        self.reused = False

    def closed_by_server(self) -> bool:
        # An idle keep-alive connection receives nothing: readable means EOF (the server closed
        # it) or bytes that answer no request of ours; either way it is not usable.
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class _Unanswered(ConnectionError):
    """The connection broke before any byte of the answer arrived."""


@dataclass
class _Head:
    status: int
    headers: tuple[tuple[str, str], ...]
    framing: str  # "none", "length", "chunked" or "eof"
    length: int
    keep_alive: bool


class Pool:
    """Persistent connections to the server at ``url`` (``https://host:port`` or ``http://``)."""

    def __init__(
        self,
        url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        proxy: str | None = None,
        proxy_headers: Mapping[str, str] | None = None,
        keep: int = 10,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(f"server URL must be http:// or https://host[:port], not {url!r}")
        if parts.scheme == "https" and ssl_context is None:
            raise InvalidRequest(f"https server {url!r} needs an ssl_context")
        self._netloc = parts.netloc
        self._address = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        self._tls = ssl_context if parts.scheme == "https" else None
        self._server_hostname = server_hostname or parts.hostname
        self._keep = keep
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._connect_to = self._address
        self._tunnel: bytes | None = None  # the CONNECT request, with a proxy for https
        self._target_prefix = ""  # the absolute-form prefix, with a proxy for http
        proxy_lines = "".join(f"{k}: {v}\r\n" for k, v in (proxy_headers or {}).items())
        if proxy:
            via = urlsplit(proxy)
            if via.scheme != "http" or not via.hostname:
                raise InvalidRequest(f"proxy must be http://host[:port], not {proxy!r}")
            self._connect_to = (via.hostname, via.port or 80)
            authority = f"{self._address[0]}:{self._address[1]}"
            if ":" in self._address[0]:
                authority = f"[{self._address[0]}]:{self._address[1]}"
            if self._tls:
                self._tunnel = _checked(
                    f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{proxy_lines}\r\n",
                    3 + len(proxy_headers or {}),
                )
            else:
                self._target_prefix = f"http://{self._netloc}"
        # Sent with every request; proxy headers too when the proxy sees each request.
        self._fixed = f"Host: {self._netloc}\r\n"
        self._fixed_lines = 1
        if proxy and not self._tunnel:
            self._fixed += proxy_lines
            self._fixed_lines += len(proxy_headers or {})
        _checked(self._fixed, self._fixed_lines)

    # ----- requests ------------------------------------------------------------------------

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeouts: Timeouts,
    ) -> Response:
        """One request and its whole answer; ``target`` is the path with its query."""
        conn, head = self._exchange(method, self._encode(method, target, headers, body), timeouts)
        try:
            data = self._body(conn, head)
        except BaseException:
            conn.close()
            raise
        self._release(conn, head.keep_alive)
        return Response(head.status, head.headers, data)

    def stream(
        self, method: str, target: str, headers: Mapping[str, str], timeouts: Timeouts
    ) -> Stream:
        """One request whose answer is read as it comes (a watch); close the result when done."""
        conn, head = self._exchange(method, self._encode(method, target, headers, None), timeouts)
        return Stream(self, conn, head)

    def close(self) -> None:
        """Close the idle connections; a later request opens new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ----- connections ---------------------------------------------------------------------

    def _checkout(self, timeout: float) -> _Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open(timeout)
            if not conn.closed_by_server():
                conn.reused = True
                return conn
            conn.close()

    def _release(self, conn: _Connection, keep_alive: bool) -> None:
        if keep_alive:
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(conn)
                    return
        conn.close()

    def _open(self, timeout: float) -> _Connection:
        where = f"{self._connect_to[0]}:{self._connect_to[1]}"
        try:
            sock = socket.create_connection(self._connect_to, timeout=timeout)
        except TimeoutError as err:
            raise TimeoutError(f"no connection to {where} within {timeout:g} s") from err
        except OSError as err:
            raise ConnectionError(f"cannot connect to {where}: {err}") from err
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tunnel:
                _open_tunnel(sock, self._tunnel, where)
            if self._tls:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_hostname)
        except TimeoutError as err:
            sock.close()
            raise TimeoutError(
                f"no TLS handshake with {self._netloc} within {timeout:g} s"
            ) from err
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    # ----- the exchange --------------------------------------------------------------------

    def _encode(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        lines = [f"{method} {self._target_prefix}{target} HTTP/1.1\r\n", self._fixed]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        lines.append("\r\n")
        if " " in target:
            raise InvalidRequest(f"space in request target {target!r}")
        return _checked("".join(lines), len(lines) - 1 + self._fixed_lines) + (body or b"")

    def _exchange(self, method: str, data: bytes, timeouts: Timeouts) -> tuple[_Connection, _Head]:
        conn = self._checkout(timeouts.connect)
        try:
            return conn, self._start(conn, data, timeouts.read, method)
        except _Unanswered:
            conn.close()
            if not (conn.reused and method in RETRIED):
                raise
        except BaseException:
            conn.close()
            raise
        conn = self._open(timeouts.connect)
        try:
            return conn, self._start(conn, data, timeouts.read, method)
        except BaseException:
            conn.close()
            raise

    def _start(self, conn: _Connection, data: bytes, timeout: float, method: str) -> _Head:
        """Send ``data`` and read the answer's status line and headers."""
        conn.sock.settimeout(timeout)
        try:
            conn.sock.sendall(data)
            line = conn.rfile.readline(MAX_LINE + 1)
        except TimeoutError as err:
            raise TimeoutError(f"no answer from {self._netloc} within {timeout:g} s") from err
        except (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError) as err:
            raise _Unanswered(f"{self._netloc} closed the connection: {err}") from err
        if not line:
            raise _Unanswered(f"{self._netloc} closed the connection without an answer")
        try:
            while True:
                status, version = _status(line)
                headers = _headers(conn.rfile)
                if not 100 <= status < 200:
                    break
                line = conn.rfile.readline(MAX_LINE + 1)  # after 100 Continue, the real answer
        except TimeoutError as err:
            raise TimeoutError(f"no answer from {self._netloc} within {timeout:g} s") from err
        return _frame(status, version, headers, method)

    def _body(self, conn: _Connection, head: _Head) -> bytes:
        try:
            return _read_body(conn.rfile, head)
        except TimeoutError as err:
            raise TimeoutError(f"{self._netloc} stopped sending within the read timeout") from err


class Stream:
    """An answer read as it comes; :meth:`close` returns or closes its connection."""

    def __init__(self, pool: Pool, conn: _Connection, head: _Head) -> None:
        self.status = head.status
        self.headers = head.headers
        self._pool = pool
        self._conn: _Connection | None = conn
        self._head = head

    def read(self) -> bytes:
        """The whole remaining body (for an error answer), then the stream is closed."""
        assert self._conn is not None, "stream already closed"
        try:
            data = self._pool._body(self._conn, self._head)
        except BaseException:
            self._abandon()
            raise
        self._finish()
        return data

    def lines(self) -> Iterator[bytes]:
        """The body's lines (without ``\\n``) as they arrive; a last unterminated one too."""
        assert self._conn is not None, "stream already closed"
        parts: list[bytes] = []  # of a line not ended yet (an object can be megabytes)
        try:
            for piece in _pieces(self._conn.rfile, self._head):
                parts.append(piece)
                if b"\n" in piece:
                    *whole, rest = b"".join(parts).split(b"\n")
                    parts = [rest]
                    yield from whole
        except TimeoutError as err:
            self._abandon()
            raise TimeoutError(
                f"{self._pool._netloc} sent nothing within the read timeout"
            ) from err
        except BaseException:
            self._abandon()  # an error, or the caller left midway (GeneratorExit)
            raise
        if last := b"".join(parts):
            yield last
        self._finish()

    def close(self) -> None:
        """Return the connection after a complete body; close it when the body was left midway."""
        self._abandon()

    def _finish(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._pool._release(conn, self._head.keep_alive)

    def _abandon(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()


# ----- parsing (pure over a reader) ------------------------------------------------------------


def _checked(text: str, lines: int) -> bytes:
    """``text`` of ``lines`` CRLF-ended lines as bytes, refusing a CR or LF inside a line (a
    header value that would inject another header, or a request)."""
    if text.count("\n") != lines or text.count("\r") != lines:
        raise InvalidRequest("line break inside a request line or header value")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError as err:
        raise InvalidRequest(f"request header is not Latin-1: {err}") from err


def _status(line: bytes) -> tuple[int, bytes]:
    version, _, rest = line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or not code.isdigit() or rest[3:4] not in b" \r\n":
        raise ProtocolError(f"not an HTTP/1.x status line: {line[:100]!r}")
    return int(code), version


def _headers(rfile: _Lines) -> tuple[tuple[str, str], ...]:
    readline = rfile.readline
    out: list[tuple[str, str]] = []
    for _ in range(MAX_HEADERS):
        line = readline(MAX_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return tuple(out)
        if not line:
            raise ProtocolError("connection closed inside the response headers")
        if len(line) > MAX_LINE:
            raise ProtocolError(f"response header line longer than {MAX_LINE} bytes")
        name, sep, value = line.partition(b":")
        if not sep or not name or name[:1] in b" \t":
            raise ProtocolError(f"malformed response header: {line[:100]!r}")
        # Header text is ASCII in practice; UTF-8 keeps a non-ASCII Warning readable.
        out.append((name.decode("latin-1").lower(), value.strip().decode(errors="replace")))
    raise ProtocolError(f"more than {MAX_HEADERS} response headers")


def _frame(status: int, version: bytes, headers: tuple[tuple[str, str], ...], method: str) -> _Head:
    """How the body is delimited, and whether the connection can serve another request."""
    coding = length = connection = None
    for name, value in headers:
        if name == "transfer-encoding":
            coding = value.lower()
        elif name == "content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise ProtocolError(f"bad Content-Length {value!r}")
            length = int(value)
        elif name == "connection":
            connection = value.lower()
    keep_alive = version == b"HTTP/1.1" and not (
        connection and "close" in (token.strip() for token in connection.split(","))
    )
    if method == "HEAD" or status in (204, 304):
        return _Head(status, headers, "none", 0, keep_alive)
    if coding is not None:
        if coding.rsplit(",", 1)[-1].strip() != "chunked":
            raise ProtocolError(f"unsupported Transfer-Encoding {coding!r}")
        return _Head(status, headers, "chunked", 0, keep_alive)
    if length is not None:
        return _Head(status, headers, "length", length, keep_alive)
    return _Head(status, headers, "eof", 0, False)


def _read_body(rfile: io.BufferedReader, head: _Head) -> bytes:
    if head.framing == "none":
        return b""
    if head.framing == "length":
        data = rfile.read(head.length)
        if len(data) < head.length:
            raise ProtocolError(f"connection closed after {len(data)} of {head.length} body bytes")
        return data
    if head.framing == "eof":
        return rfile.read()
    return b"".join(_pieces(rfile, head))


def _pieces(rfile: io.BufferedReader, head: _Head) -> Iterator[bytes]:
    """The body in pieces as they arrive: chunks, or reads of what the socket has."""
    read, readline = rfile.read, rfile.readline
    if head.framing == "chunked":
        while True:
            line = readline(MAX_LINE + 1)
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                if not line:
                    raise ProtocolError("connection closed inside a chunked body") from None
                raise ProtocolError(f"bad chunk size line {line[:100]!r}") from None
            if size == 0:
                _headers(rfile)  # trailers, dropped
                return
            data = read(size)
            if len(data) < size or read(2) != b"\r\n":
                raise ProtocolError("connection closed inside a chunk, or chunk not CRLF-ended")
            yield data
    elif head.framing == "length":
        left = head.length
        while left:
            data = rfile.read1(min(left, STREAM_READ))
            if not data:
                raise ProtocolError(f"connection closed with {left} body bytes missing")
            left -= len(data)
            yield data
    elif head.framing == "eof":
        while data := rfile.read1(STREAM_READ):
            yield data


def _open_tunnel(sock: socket.socket, connect: bytes, where: str) -> None:
    """Ask the proxy on ``sock`` for a tunnel; its answer is read unbuffered (TLS follows)."""
    sock.sendall(connect)
    raw = sock.makefile("rb", buffering=0)
    try:
        status, _ = _status(raw.readline(MAX_LINE + 1))
        _headers(raw)
    finally:
        raw.close()
    if not 200 <= status < 300:
        raise ConnectionError(f"proxy {where} refused the tunnel: HTTP {status}")
