"""The HTTPS endpoint of the admission webhook: a thin layer around :func:`admission.review`.

``POST /validate`` takes an AdmissionReview and answers with :func:`admission.review`'s result;
``GET /healthz`` answers ``ok``. One thread per connection (``ThreadingHTTPServer``), HTTP/1.1
keep-alive so the API server reuses its connections. The TLS handshake runs in the connection's
own thread (``do_handshake_on_connect=False``), so a slow or broken client never blocks the
accept loop. Every replica serves, leader or not: admission needs no coordination.

Every review gets an answer, never a dropped connection (which the API server reports as
``failed calling webhook: EOF`` and, under failurePolicy Fail, turns into a refusal with no
reason): a body nested deeper than :data:`MAX_DEPTH` is refused saying so, and an exception of
the reviewer is logged at ERROR with its traceback and answered with a refusal naming it.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.controller import admission, bounded_json
from dra_gpu.controller.registration import VALIDATE_PATH

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024  # AdmissionReviews carry an object and its old version (<= 3 MiB each)
# Far deeper than any valid review (a template's selectors are 12 levels down, the deepest
# GpuConfig field 14), far below where Python's json gives up (about 1,000).
MAX_DEPTH = 64
Reviewer = Callable[[Mapping[str, Any]], dict[str, Any]]


def _describe(review: object) -> str:
    """``Kind namespace/name (uid)`` of a review, for log lines."""
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        return "a review without a request"
    kind = request.get("kind")
    kind_name = kind.get("kind") if isinstance(kind, dict) else None
    where = "/".join(str(p) for p in (request.get("namespace"), request.get("name")) if p)
    return f"{kind_name} {where or '?'} (uid {request.get('uid')})"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 60  # idle keep-alive connections are dropped after this
    # Headers and body leave in one TLS record, and without Nagle's delay: a reply split into
    # two writes otherwise waits for the client's delayed ACK (~40 ms per admission).
    disable_nagle_algorithm = True
    wbufsize = 64 * 1024

    def setup(self) -> None:
        super().setup()
        conn = self.connection
        if isinstance(conn, ssl.SSLSocket):
            conn.do_handshake()

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            self._reply(200, b"ok", "text/plain")
        else:
            self._reply(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != VALIDATE_PATH:
            self._reply(404, b"not found", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self.close_connection = True
            self._reply(413 if length > 0 else 400, b"body missing or too large", "text/plain")
            return
        try:
            decoded = bounded_json.loads(self.rfile.read(length).decode(), max_depth=MAX_DEPTH)
            if not isinstance(decoded.value, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            self._reply(400, f"not an AdmissionReview: {exc}".encode(), "text/plain")
            return
        answer = self._answer(decoded)
        self._reply(200, json.dumps(answer).encode(), "application/json")

    def _answer(self, decoded: bounded_json.Decoded) -> dict[str, Any]:
        """The reply to a decoded review. Every review gets one: an answer the API server does
        not get is a failed call, which refuses (failurePolicy Fail) with no reason given."""
        if decoded.cut:
            log.warning(
                "refused %s: nested more than %d levels", _describe(decoded.value), MAX_DEPTH
            )
            return admission.refusal(
                decoded.value,
                f"the object is nested more than {MAX_DEPTH} levels deep; "
                "no valid ResourceClaim, ResourceClaimTemplate or DeviceClass is",
            )
        try:
            return self.server.reviewer(decoded.value)
        except Exception as exc:
            # A defect of ours, not of the object. Refused: what could not be checked here might
            # fail prepare later, when it is harder to see why (the same rule as failurePolicy).
            log.exception("internal error reviewing %s", _describe(decoded.value))
            return admission.refusal(
                decoded.value,
                f"internal error of the {DRIVER_NAME} admission webhook "
                f"({type(exc).__name__}); the object was not checked, so it is refused; "
                "the controller's log has the details",
            )

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def log_error(self, format: str, *args: Any) -> None:
        log.info("webhook connection %s: " + format, self.address_string(), *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    reviewer: Reviewer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_open_connections(self) -> None:
        """End every kept-alive connection: a stopped server must not go on answering on them
        (the API server then reconnects, through the Service, to a replica that still serves)."""
        with self._open_lock:
            open_now = list(self._open)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # TLS failures of probing clients are routine; never print tracebacks for them.
        log.info("webhook connection from %s failed", client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class WebhookServer:
    """Serves ``reviewer`` over HTTPS on ``host:port`` (port 0 picks a free one) in a thread."""

    def __init__(
        self, *, host: str, port: int, context: ssl.SSLContext, reviewer: Reviewer
    ) -> None:
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _Handler, bind_and_activate=True)
        self._server.reviewer = reviewer
        self._server.socket = context.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.close_open_connections()
        self._thread.join(timeout=5)
