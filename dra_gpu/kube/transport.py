"""HTTP to one API server over urllib3: the API client's transport, and the only module here
that imports urllib3.

Why urllib3 and not a client of our own: a hand-written HTTP/1.1 reader answered a request on a
pooled connection with bytes left over from the previous answer, and failed with raw
ValueError/OverflowError on odd Content-Length values. urllib3 reads every answer from a fresh
buffer and replaces an idle connection that has unread bytes; what it lets through (a
Content-Length beside chunked coding, a Content-Length that is not one decimal number) is
refused here before the body is read, and that connection is closed.

- One pool per API server, :data:`POOL_CONNECTIONS` connections, non-blocking (see there).
- TCP_NODELAY: urllib3's default socket options (a request is one write; its answer must not
  wait for an ACK).
- Every request has a connect and a read timeout; the read timeout bounds each wait for bytes.
- Retry (:class:`_BrokenConnectionRetry`): a GET or HEAD whose connection broke (closed or
  reset before or while the answer came) is sent once more. Nothing else is retried here:
  not a connect failure, a TLS error or a timeout (the caller's loop retries with backoff and
  logs), and never a POST, PUT, PATCH or DELETE, which may have taken effect before the
  connection broke (callers retry those with what they know: AlreadyExists, Conflict).
- Proxies: :func:`proxy_from_environment` (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY`` as
  the standard library reads them), or the kubeconfig's ``proxy-url``; https is tunnelled with
  CONNECT, credentials in the proxy URL are sent as ``Proxy-Authorization``.
- Failures are :mod:`errors` types: no usable answer (refused, timeout, broken connection,
  TLS error, a malformed answer) is ``ApiUnavailable``; a request that cannot be sent as given
  (a line break in a header) is ``ApiError``.
"""

from __future__ import annotations

import re
import ssl
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import unquote, urlsplit

import urllib3
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import HTTPError, LocationValueError, MaxRetryError, ReadTimeoutError
from urllib3.response import BaseHTTPResponse

from dra_gpu.kube import errors

# Connections kept per API server. The kubelet plugin runs up to 16 DRA calls at once, each
# with a claim GET, beside its publisher's watch and writes: a smaller pool closes the
# connections it cannot keep, so every burst pays new TLS handshakes (CPU here and in the API
# server). Non-blocking: a request beyond these never waits for another's connection (a watch
# holds one for minutes); it opens one more, which is closed when it is returned.
POOL_CONNECTIONS = 24
# The longest answer read: far beyond any object or list the callers read; a larger
# Content-Length is a broken or hostile answer, refused before anything is allocated.
MAX_BODY = 1 << 30
STREAM_READ = 65536
RETRIED = frozenset({"GET", "HEAD"})
_DECIMAL = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    warnings: tuple[str, ...]  # the raw ``Warning`` header values, in the order sent


class _BrokenConnectionRetry(urllib3.Retry):
    """urllib3's read retry for GET and HEAD, less read timeouts.

    A read timeout means a slow server, not a broken connection: asking again would double
    the caller's wait.
    """

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: Any = None,
    ) -> Self:
        retry = self.new(read=0) if isinstance(error, ReadTimeoutError) and self.read else self
        return super(_BrokenConnectionRetry, retry).increment(
            method, url, response, error, _pool, _stacktrace
        )


_RETRY = _BrokenConnectionRetry(
    total=None,
    connect=0,
    read=1,
    redirect=0,
    status=0,
    other=0,
    allowed_methods=RETRIED,
    raise_on_redirect=False,
    raise_on_status=False,
)


def proxy_from_environment(server: str) -> str | None:
    """The proxy for ``server`` from the environment, or None (direct).

    The standard library's rules: ``HTTPS_PROXY`` for an https server, ``HTTP_PROXY`` for
    http (either case, lower case first), unless ``NO_PROXY`` names the host.
    """
    parts = urlsplit(server)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme)
    # proxy_bypass_environment is what urllib.request itself decides with; typeshed omits it.
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    # With the port (an entry may name one) and without (an IPv6 entry written unbracketed).
    if not proxy or bypass(parts.netloc, proxies) or bypass(parts.hostname, proxies):
        return None
    return proxy


def framing_problem(content_length: list[str], transfer_encoding: list[str]) -> str | None:
    """What is wrong with an answer's framing headers (all their values), or None."""
    coding = ",".join(transfer_encoding).strip().lower()
    if transfer_encoding and coding != "chunked":
        return f"unsupported Transfer-Encoding {coding!r}"
    if not content_length:
        return None
    if transfer_encoding:
        return "both Content-Length and Transfer-Encoding"
    values = {v.strip() for value in content_length for v in value.split(",")}
    if len(values) != 1 or not all(_DECIMAL.fullmatch(v) for v in values):
        return f"bad Content-Length {', '.join(content_length)!r}"
    if int(values.pop()) > MAX_BODY:
        return f"Content-Length {content_length[0]} beyond {MAX_BODY} bytes"
    return None


class Transport:
    """Pooled connections to the API server at ``server`` (``https://host[:port]`` or http)."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        proxy: str | None = None,
        proxy_headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.ApiError(f"server URL must be https:// or http://host[:port]: {server!r}")
        self._server = f"{parts.scheme}://{parts.netloc}"
        pool: dict[str, Any] = {"maxsize": POOL_CONNECTIONS, "block": False}
        if ssl_context is not None:
            pool["ssl_context"] = ssl_context
        if server_hostname:
            pool["server_hostname"] = server_hostname
        self._manager: urllib3.PoolManager
        if proxy is None:
            self._manager = urllib3.PoolManager(num_pools=1, **pool)
            return
        headers = dict(proxy_headers or {})
        try:
            auth = urllib3.util.parse_url(proxy).auth
            if auth:
                headers.update(urllib3.util.make_headers(proxy_basic_auth=unquote(auth)))
            self._manager = urllib3.ProxyManager(proxy, num_pools=1, proxy_headers=headers, **pool)
        except (HTTPError, ValueError) as err:  # an unknown scheme is an AssertionError too
            raise errors.ApiError(f"cannot use the proxy: {err}") from err

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        connect_s: float,
        read_s: float,
        request: str,
    ) -> Answer:
        """One request and its whole answer; ``target`` is the path with its query."""
        resp = self._open(method, target, headers, body, connect_s, read_s, request)
        try:
            data = resp.read()
        except (HTTPError, OSError) as err:
            raise errors.ApiUnavailable(_why(err), request=request) from err
        finally:
            _done(resp)
        return Answer(resp.status, data, _warnings(resp))

    def stream(
        self,
        target: str,
        headers: Mapping[str, str],
        *,
        connect_s: float,
        read_s: float,
        request: str,
    ) -> Stream:
        """A GET whose answer is read as it comes (a watch); close the result when done."""
        resp = self._open("GET", target, headers, None, connect_s, read_s, request)
        return Stream(resp, request)

    def close(self) -> None:
        """Close the pooled connections; a later request opens new ones."""
        self._manager.clear()

    def _open(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        connect_s: float,
        read_s: float,
        request: str,
    ) -> BaseHTTPResponse:
        try:
            resp = self._manager.urlopen(
                method,
                self._server + target,
                body=body,
                headers=dict(headers),
                timeout=urllib3.Timeout(connect=connect_s, read=read_s),
                retries=_RETRY,
                redirect=False,
                preload_content=False,
            )
        except LocationValueError as err:
            raise errors.ApiError(f"cannot send the request: {err}", request=request) from err
        except (HTTPError, OSError) as err:
            raise errors.ApiUnavailable(_why(err), request=request) from err
        except ValueError as err:  # http.client refuses a header value with a line break
            raise errors.ApiError(f"cannot send the request: {err}", request=request) from err
        problem = framing_problem(
            resp.headers.getlist("content-length"), resp.headers.getlist("transfer-encoding")
        )
        if problem:
            _done(resp)
            raise errors.ApiUnavailable(f"malformed answer: {problem}", request=request)
        return resp


class Stream:
    """An answer read as it comes; :meth:`close` returns or closes its connection."""

    def __init__(self, resp: BaseHTTPResponse, request: str) -> None:
        self.status = resp.status
        self._resp = resp
        self._request = request

    def read(self) -> bytes:
        """The whole remaining body (an error answer's)."""
        try:
            return self._resp.read()
        except (HTTPError, OSError) as err:
            raise errors.ApiUnavailable(_why(err), request=self._request) from err

    def lines(self) -> Iterator[bytes]:
        """The body's lines (without ``\\n``) as they arrive; a last unterminated one too."""
        parts: list[bytes] = []  # of a line not ended yet (an object can be megabytes)
        try:
            while piece := self._resp.read1(STREAM_READ):
                parts.append(piece)
                if b"\n" in piece:
                    *whole, rest = b"".join(parts).split(b"\n")
                    parts = [rest]
                    yield from whole
        except (HTTPError, OSError) as err:
            raise errors.ApiUnavailable(_why(err), request=self._request) from err
        if last := b"".join(parts):
            yield last

    def close(self) -> None:
        """After a complete body its connection is back in the pool; midway it is closed."""
        _done(self._resp)


def _done(resp: BaseHTTPResponse) -> None:
    # After a complete body urllib3 has already returned the connection (close() then leaves
    # it alone); before that, close() closes the socket, so the connection goes back unused.
    resp.close()
    resp.release_conn()


def _warnings(resp: BaseHTTPResponse) -> tuple[str, ...]:
    # http.client decodes header bytes as Latin-1; the API server's warnings are UTF-8.
    return tuple(
        value.encode("latin-1", "replace").decode(errors="replace")
        for value in resp.headers.getlist("warning")
    )


def _why(err: Exception) -> str:
    """urllib3's own words for a failure, without its retry wrapper."""
    if isinstance(err, MaxRetryError) and err.reason is not None:
        err = err.reason
    return str(err)
