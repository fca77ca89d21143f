"""The HTTPS endpoint of the admission webhook: a thin layer around :func:`admission.review`.

``POST /validate`` takes an AdmissionReview and answers with :func:`admission.review`'s result;
``GET /healthz`` answers ``ok``. One thread per connection (``ThreadingHTTPServer``), HTTP/1.1
keep-alive so the API server reuses its connections. The TLS handshake runs in the connection's
own thread (``do_handshake_on_connect=False``), so a slow or broken client never blocks the
accept loop. Every replica serves, leader or not: admission needs no coordination.
"""

from __future__ import annotations

import http.server
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dra_gpu.controller.registration import VALIDATE_PATH

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024  # AdmissionReviews carry an object and its old version (<= 3 MiB each)
Reviewer = Callable[[Mapping[str, Any]], dict[str, Any]]


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
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            self.close_connection = True
            self._reply(413 if length else 400, b"body missing or too large", "text/plain")
            return
        try:
            review = json.loads(self.rfile.read(length))
            if not isinstance(review, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            self._reply(400, f"not an AdmissionReview: {exc}".encode(), "text/plain")
            return
        answer = self.server.reviewer(review)
        self._reply(200, json.dumps(answer).encode(), "application/json")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def log_error(self, format: str, *args: Any) -> None:
        log.info("webhook connection %s: " + format, self.address_string(), *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    reviewer: Reviewer

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
        self._thread.join(timeout=5)
