"""HTTP probes: ``/healthz`` and ``/livez`` for liveness, ``/readyz`` for readiness.

Live: 200 when the plugin's gRPC servers are up and the ResourceSlices were published at least
once; 503 otherwise, with a one-line reason. "At least once" on purpose: an API server outage
must not make a liveness probe restart a plugin that keeps serving the kubelet.

Ready: live, and the kubelet has confirmed the registration. A rolling update replaces the old
pod once the new one is Ready; Ready before the kubelet switched to the new instance, the old one
stopped while the kubelet still sent it calls (a pod failed with "connection refused" on the old
DRA socket when start-up got fast enough to be Ready within the kubelet's registration delay).

It listens on 127.0.0.1 unless told otherwise: a kubelet probe reaches a pod on the pod IP, so a
DaemonSet without host networking sets ``--healthz-address 0.0.0.0``; with host networking
127.0.0.1 keeps the endpoint off the node's network.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

# Returns None when healthy, else the reason.
Check = Callable[[], str | None]


class _Handler(BaseHTTPRequestHandler):
    live: Check
    ready: Check

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/healthz", "/readyz", "/livez"):
            self._reply(404, "not found\n")
            return
        problem = self.ready() if path == "/readyz" else self.live()
        if problem is None:
            self._reply(200, "ok\n")
        else:
            self._reply(503, f"{problem}\n")

    def _reply(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("healthz: " + format, *args)


class HealthzServer:
    def __init__(self, *, address: str, port: int, live: Check, ready: Check) -> None:
        checks = {"live": staticmethod(live), "ready": staticmethod(ready)}
        handler = type("Handler", (_Handler,), checks)
        self._server = ThreadingHTTPServer((address, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name="healthz"
        )
        self._thread.daemon = True

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving /healthz on port %d", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
