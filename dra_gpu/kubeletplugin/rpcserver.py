"""The builtin gRPC server: a method table (``rpc_methods``) served over HTTP/2 on unix sockets.

Why not grpcio: its C core costs the plugin ~17 MiB of memory, and every call crosses from the
core's polling thread to a worker; the kubelet makes a handful of calls per pod. This server is
threads and blocking sockets:

- one thread accepts connections; one reader thread per connection parses frames;
- every call runs on a bounded worker pool (16 for the DRA socket, as with grpcio), so calls on
  ONE connection run concurrently (the kubelet sends concurrent prepares over one connection).
  A unary handler is not run on the reader thread: while it ran, no other frame of the
  connection would be read, so a second call would wait for the first to finish;
- a server-streaming handler is an iterator, run on a worker for the stream's life; its
  ``CallContext.is_active()`` turns false when the client resets the stream or the connection
  closes, and the iterator is closed at its next response.

HTTP/2 (RFC 9113) as a client needs it: preface, SETTINGS exchange and ACK, the peer's
MAX_FRAME_SIZE and INITIAL_WINDOW_SIZE, flow control both ways (our DATA waits for the peer's
window; we give back what we received with WINDOW_UPDATE), PING ACK, HEADERS + CONTINUATION,
PADDED and PRIORITY flags, RST_STREAM, GOAWAY (sent on stop: calls in flight finish within the
grace period, new streams are refused; received: no new streams), unknown frame types ignored.
A protocol error ends the connection with GOAWAY naming it; it never stops the server.

gRPC: length-prefixed messages, no compression (a compressed message is UNIMPLEMENTED),
requests up to 4 MiB (larger: RESOURCE_EXHAUSTED), unknown methods UNIMPLEMENTED, errors as
trailers-only responses with a percent-encoded ``grpc-message``. ``grpc-timeout`` is ignored:
the kubelet enforces its own deadline and cancels the stream, and a handler cannot be
interrupted anyway.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

import hpack

from dra_gpu.kubeletplugin import h2frames as h2
from dra_gpu.kubeletplugin.rpc_methods import Abort, Code, Method

log = logging.getLogger(__name__)

MAX_RECEIVE = 4 * 1024 * 1024  # gRPC's default receive limit
STREAM_WINDOW = 1 << 20  # each stream may send this much before we give some back
CONNECTION_WINDOW = 16 << 20
MAX_HEADER_BLOCK = 64 * 1024
_READ_SIZE = 65_536

_OUR_SETTINGS = h2.settings(
    {h2.INITIAL_WINDOW_SIZE: STREAM_WINDOW, h2.MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK}
) + h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW)
_RESPONSE_HEADERS = h2.STATUS_200 + h2.literal(h2.CONTENT_TYPE, b"application/grpc")
_TRAILERS_OK = h2.literal(b"grpc-status", b"0")
_PREFIX = struct.Struct(">BI")
_SEND_TIMEOUT = struct.pack("ll", 10, 0)  # struct timeval: 10 s

# hpack logs every header it decodes at DEBUG: noise in a plugin run with --log-level DEBUG.
logging.getLogger("hpack").setLevel(logging.INFO)


def percent_encoded(message: str) -> bytes:
    """``grpc-message``'s encoding: printable ASCII except '%' as is, the rest %XX of UTF-8."""
    out = bytearray()
    for byte in message.encode():
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def trailers(code: Code, message: str) -> bytes:
    if code == Code.OK and not message:
        return _TRAILERS_OK
    block = h2.literal(b"grpc-status", str(int(code)).encode())
    if message:
        block += h2.literal(b"grpc-message", percent_encoded(message))
    return block


class _Stream:
    """One call: what the client sent, and our side of its flow control."""

    __slots__ = ("active", "body", "encoding", "headers_sent", "id", "path", "pending",
                 "received", "remote_ended", "send_window")  # fmt: skip

    def __init__(self, stream_id: int, path: str, send_window: int, encoding: bytes) -> None:
        self.id = stream_id
        self.path = path
        self.send_window = send_window
        self.encoding = encoding
        self.body = bytearray()
        self.received = 0  # bytes received and not yet given back with WINDOW_UPDATE
        self.remote_ended = False
        self.headers_sent = False
        self.active = True  # false once finished, reset by the client, or the connection closed
        self.pending: list[bytes] = []  # frames not written yet

    def is_active(self) -> bool:
        return self.active


class _Connection:
    """One client connection. ``_lock`` guards all state and all writes to the socket (frames of
    one header block must not interleave with other frames); methods named ``_locked_*`` expect
    it held. The reader thread only waits for the socket; workers wait for send windows."""

    def __init__(self, server: Server, sock: socket.socket) -> None:
        self._server = server
        self._sock = sock
        # A client that stops reading must not hold a writer (and the lock, and stop()) forever.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _SEND_TIMEOUT)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # windows grew, or streams ended
        self._streams: dict[int, _Stream] = {}
        self._last_id = 0  # highest stream id the client opened
        self._send_window = h2.DEFAULT_WINDOW
        self._peer_initial_window = h2.DEFAULT_WINDOW
        self._peer_max_frame = h2.DEFAULT_MAX_FRAME
        self._received = 0  # connection-level bytes not yet given back
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK)
        self._continuing: tuple[int, bytearray, bool] | None = None
        self._first_block = True
        self._settled = False  # the client's first SETTINGS arrived
        self._closed = False
        self._going_away = False  # GOAWAY sent or received: no new streams
        self._goaway_sent = False

    # --- reading

    def run(self) -> None:
        try:
            self._write([_OUR_SETTINGS])
            self._read()
        except h2.Violation as err:
            log.warning("gRPC client broke HTTP/2 (%s); closing its connection", err)
            with self._lock:
                self._write([h2.goaway(self._last_id, err.code, str(err).encode()[:256])])
        except OSError:
            pass  # the client went away
        except Exception:
            log.exception("gRPC connection failed")
        finally:
            self.close()

    def _read(self) -> None:
        buf = bytearray()
        while len(buf) < len(h2.PREFACE):
            chunk = self._sock.recv(_READ_SIZE)
            if not chunk:
                return
            buf += chunk
            if not h2.PREFACE.startswith(bytes(buf[: len(h2.PREFACE)])):
                raise h2.Violation(h2.PROTOCOL_ERROR, "not an HTTP/2 client preface")
        del buf[: len(h2.PREFACE)]
        while True:
            at = 0
            frames = []
            while len(buf) - at >= h2.HEADER_SIZE:
                length, kind, flags, stream = h2.parse_header(buf, at)
                if length > h2.DEFAULT_MAX_FRAME:
                    raise h2.Violation(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                end = at + h2.HEADER_SIZE + length
                if end > len(buf):
                    break
                frames.append((kind, flags, stream, bytes(buf[at + h2.HEADER_SIZE : end])))
                at = end
            del buf[:at]
            if frames:
                with self._lock:
                    for kind, flags, stream, payload in frames:
                        self._locked_frame(kind, flags, stream, payload)
            chunk = self._sock.recv(_READ_SIZE)
            if not chunk:
                return
            buf += chunk

    def _locked_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if not self._settled and kind != h2.SETTINGS:
            raise h2.Violation(h2.PROTOCOL_ERROR, "the client's first frame is not SETTINGS")
        if self._continuing is not None and kind != h2.CONTINUATION:
            raise h2.Violation(h2.PROTOCOL_ERROR, "a header block is interrupted")
        if kind == h2.DATA:
            self._locked_data(flags, sid, payload)
        elif kind == h2.HEADERS:
            if sid == 0 or sid % 2 == 0:
                raise h2.Violation(h2.PROTOCOL_ERROR, f"HEADERS on stream {sid}")
            fragment = h2.header_fragment(flags, payload)
            end_stream = bool(flags & h2.END_STREAM)
            if flags & h2.END_HEADERS:
                self._locked_headers(sid, fragment, end_stream)
            else:
                self._continuing = (sid, bytearray(fragment), end_stream)
        elif kind == h2.CONTINUATION:
            if self._continuing is None or self._continuing[0] != sid:
                raise h2.Violation(h2.PROTOCOL_ERROR, f"unexpected CONTINUATION on stream {sid}")
            block = self._continuing[1]
            block += payload
            if len(block) > MAX_HEADER_BLOCK:
                raise h2.Violation(h2.ENHANCE_YOUR_CALM, "header block too large")
            if flags & h2.END_HEADERS:
                _, _, end_stream = self._continuing
                self._continuing = None
                self._locked_headers(sid, bytes(block), end_stream)
        elif kind == h2.RST_STREAM:
            if sid == 0:
                raise h2.Violation(h2.PROTOCOL_ERROR, "RST_STREAM on stream 0")
            h2.u32(payload, "RST_STREAM")
            self._locked_check_known(sid)
            stream = self._streams.pop(sid, None)
            if stream is not None:
                stream.active = False
                self._changed.notify_all()
        elif kind == h2.SETTINGS:
            self._locked_settings(flags, sid, payload)
        elif kind == h2.PING:
            if sid != 0:
                raise h2.Violation(h2.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise h2.Violation(h2.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
            if not flags & h2.ACK:
                self._write([h2.frame(h2.PING, h2.ACK, 0, payload)])
        elif kind == h2.GOAWAY:
            if sid != 0:
                raise h2.Violation(h2.PROTOCOL_ERROR, "GOAWAY on a stream")
            self._going_away = True
        elif kind == h2.WINDOW_UPDATE:
            self._locked_window_update(sid, h2.u32(payload, "WINDOW_UPDATE"))
        elif kind == h2.PUSH_PROMISE:
            raise h2.Violation(h2.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.3.2, 5.5).

    def _locked_check_known(self, sid: int) -> None:
        if sid > self._last_id:
            raise h2.Violation(h2.PROTOCOL_ERROR, f"frame on idle stream {sid}")

    def _locked_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise h2.Violation(h2.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & h2.ACK:
            if payload:
                raise h2.Violation(h2.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        for key, value in h2.parse_settings(payload):
            if key == h2.INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise h2.Violation(h2.FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {value}")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == h2.MAX_FRAME_SIZE:
                if not h2.DEFAULT_MAX_FRAME <= value <= h2.MAX_FRAME_LIMIT:
                    raise h2.Violation(h2.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self._peer_max_frame = value
            elif key == h2.ENABLE_PUSH and value > 1:
                raise h2.Violation(h2.PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
            # HEADER_TABLE_SIZE needs nothing: we never add to the client's dynamic table.
        self._settled = True
        self._write([h2.frame(h2.SETTINGS, h2.ACK, 0)])
        self._changed.notify_all()

    def _locked_window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if increment == 0:
                raise h2.Violation(h2.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > h2.MAX_WINDOW:
                raise h2.Violation(h2.FLOW_CONTROL_ERROR, "connection window beyond 2^31-1")
        else:
            self._locked_check_known(sid)
            stream = self._streams.get(sid)
            if stream is None:
                return  # a stream that ended; updates may still be on their way
            stream.send_window += increment
            if increment == 0 or stream.send_window > h2.MAX_WINDOW:
                self._locked_reset(stream, h2.FLOW_CONTROL_ERROR)
        self._changed.notify_all()

    def _locked_headers(self, sid: int, block: bytes, end_stream: bool) -> None:
        try:
            fields = dict(self._decoder.decode(block, raw=True))
        except hpack.HPACKError as err:
            raise h2.Violation(h2.COMPRESSION_ERROR, f"bad header block: {err}") from err
        stream = self._streams.get(sid)
        if stream is not None:  # the client's trailers: its half of the call ends
            if not end_stream:
                raise h2.Violation(h2.PROTOCOL_ERROR, f"second HEADERS on stream {sid}")
            if stream.remote_ended:
                self._locked_reset(stream, h2.STREAM_CLOSED)
                return
            self._locked_remote_end(stream)
            return
        if sid <= self._last_id:
            raise h2.Violation(h2.STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        self._last_id = sid
        if self._going_away:
            self._write([h2.rst_stream(sid, h2.REFUSED_STREAM)])
            return
        path = fields.get(b":path", b"").decode(errors="replace")
        encoding = fields.get(b"grpc-encoding", b"identity")
        stream = _Stream(sid, path, self._peer_initial_window, encoding)
        stream.remote_ended = end_stream
        self._streams[sid] = stream
        if fields.get(b":method") != b"POST":
            self._locked_finish(stream, Code.INTERNAL, "gRPC calls are POST requests")
        elif not fields.get(b"content-type", b"").startswith(b"application/grpc"):
            self._locked_finish(stream, Code.INTERNAL, "content-type is not application/grpc")
        elif path not in self._server.methods:
            self._locked_finish(stream, Code.UNIMPLEMENTED, f"unknown method {path}")
        elif end_stream:
            self._locked_dispatch(stream)

    def _locked_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise h2.Violation(h2.PROTOCOL_ERROR, "DATA on stream 0")
        self._received += len(payload)
        if self._received >= CONNECTION_WINDOW // 2:
            self._write([h2.window_update(0, self._received)])
            self._received = 0
        data = h2.unpad(flags, payload)
        self._locked_check_known(sid)
        stream = self._streams.get(sid)
        if stream is None:
            return  # a stream we already answered or reset
        if stream.remote_ended:
            self._locked_reset(stream, h2.STREAM_CLOSED)
            return
        stream.body += data
        if len(stream.body) >= 5:
            size = _PREFIX.unpack_from(stream.body)[1]
            if size > MAX_RECEIVE or len(stream.body) > MAX_RECEIVE + 5:
                self._locked_finish(
                    stream,
                    Code.RESOURCE_EXHAUSTED,
                    f"received message larger than max ({size} vs. {MAX_RECEIVE})",
                )
                return
        if flags & h2.END_STREAM:
            stream.remote_ended = True
            self._locked_dispatch(stream)
            return
        stream.received += len(payload)
        if stream.received >= STREAM_WINDOW // 2:
            self._write([h2.window_update(sid, stream.received)])
            stream.received = 0

    def _locked_remote_end(self, stream: _Stream) -> None:
        stream.remote_ended = True
        self._locked_dispatch(stream)

    def _locked_dispatch(self, stream: _Stream) -> None:
        """The client sent its whole request: run the call on a worker."""
        body = bytes(stream.body)
        stream.body = bytearray()
        try:
            message = _request_message(body, stream.encoding)
        except Abort as err:
            self._locked_finish(stream, err.code, err.message)
            return
        try:
            self._server.pool.submit(self._call, stream, self._server.methods[stream.path], message)
        except RuntimeError:  # the pool is shut down: the server stops
            self._locked_reset(stream, h2.REFUSED_STREAM)

    # --- calls (worker threads)

    def _call(self, stream: _Stream, method: Method, data: bytes) -> None:
        if not stream.active:
            return  # cancelled while it waited for a worker
        try:
            request = method.parse(data)
        except Exception as err:
            self._finish(stream, Code.INTERNAL, f"cannot parse the request: {err}")
            return
        responses: Iterable[Any] = ()
        code, message = Code.OK, ""
        try:
            result = method.handle(request, stream)
            responses = result if method.streaming else (result,)
            for response in responses:
                if not self._send(stream, method.serialize(response), flush=method.streaming):
                    return
        except Abort as err:
            code, message = err.code, err.message
        except Exception as err:
            log.exception("gRPC method %s failed", method.path)
            code, message = Code.UNKNOWN, f"Exception calling application: {err}"
        finally:
            if isinstance(responses, Iterator) and hasattr(responses, "close"):
                responses.close()
        self._finish(stream, code, message)

    def _send(self, stream: _Stream, payload: bytes, *, flush: bool) -> bool:
        """Queue one response message (and the response headers before the first); False when
        the stream is gone. Waits for the peer's flow-control windows."""
        data = _PREFIX.pack(0, len(payload)) + payload
        with self._lock:
            if not stream.active:
                return False
            if not stream.headers_sent:
                stream.headers_sent = True
                stream.pending += self._locked_header_frames(stream.id, _RESPONSE_HEADERS, False)
            while data:
                while stream.active and min(self._send_window, stream.send_window) <= 0:
                    if stream.pending:
                        self._write(stream.pending)
                        stream.pending = []
                    self._changed.wait()
                if not stream.active:
                    return False
                size = min(len(data), self._send_window, stream.send_window, self._peer_max_frame)
                stream.pending.append(h2.frame(h2.DATA, 0, stream.id, data[:size]))
                data = data[size:]
                self._send_window -= size
                stream.send_window -= size
            if flush:
                self._write(stream.pending)
                stream.pending = []
        return True

    def _finish(self, stream: _Stream, code: Code, message: str) -> None:
        with self._lock:
            self._locked_finish(stream, code, message)

    def _locked_finish(self, stream: _Stream, code: Code, message: str) -> None:
        """End the call with its status (trailers-only when no response was sent)."""
        if not stream.active:
            return
        block = trailers(code, message)
        if not stream.headers_sent:
            block = _RESPONSE_HEADERS + block
        frames = stream.pending + self._locked_header_frames(stream.id, block, True)
        if not stream.remote_ended:  # answered before the request ended: it may stop sending
            frames.append(h2.rst_stream(stream.id, h2.NO_ERROR))
        self._write(frames)
        self._locked_forget(stream)

    def _locked_reset(self, stream: _Stream, code: int) -> None:
        self._write([h2.rst_stream(stream.id, code)])
        self._locked_forget(stream)

    def _locked_forget(self, stream: _Stream) -> None:
        stream.active = False
        stream.pending = []
        self._streams.pop(stream.id, None)
        self._changed.notify_all()

    def _locked_header_frames(self, sid: int, block: bytes, end_stream: bool) -> list[bytes]:
        if self._first_block:
            # Our encoder's table is empty and stays so; saying it has size 0 keeps that valid
            # whatever HEADER_TABLE_SIZE the client sets later.
            block = h2.TABLE_SIZE_ZERO + block
            self._first_block = False
        flags = h2.END_STREAM if end_stream else 0
        limit = self._peer_max_frame
        if len(block) <= limit:
            return [h2.frame(h2.HEADERS, flags | h2.END_HEADERS, sid, block)]
        parts = [block[i : i + limit] for i in range(0, len(block), limit)]
        frames = [h2.frame(h2.HEADERS, flags, sid, parts[0])]
        frames += [h2.frame(h2.CONTINUATION, 0, sid, part) for part in parts[1:-1]]
        frames.append(h2.frame(h2.CONTINUATION, h2.END_HEADERS, sid, parts[-1]))
        return frames

    def _write(self, frames: list[bytes]) -> None:
        if self._closed:
            return
        try:
            self._sock.sendall(b"".join(frames))
        except OSError:
            self._closed = True  # the reader sees the socket end too
            self._sock.close()

    # --- stopping

    def go_away(self) -> None:
        """Refuse new streams; those in flight go on."""
        with self._lock:
            if not self._goaway_sent:
                self._going_away = self._goaway_sent = True
                self._write([h2.goaway(self._last_id, h2.NO_ERROR)])

    def idle(self) -> bool:
        with self._lock:
            return not self._streams

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for stream in self._streams.values():
                stream.active = False
            self._streams.clear()
            self._changed.notify_all()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._server.forget(self)


def _request_message(body: bytes, encoding: bytes) -> bytes:
    """The one message of a request body (a 5-byte prefix: compressed flag, length)."""
    if len(body) < 5:
        raise Abort(Code.INTERNAL, "the request carries no message")
    compressed, size = _PREFIX.unpack_from(body)
    if len(body) != 5 + size:
        raise Abort(Code.INTERNAL, "the request is not exactly one message")
    if compressed:
        if encoding != b"identity":
            raise Abort(Code.UNIMPLEMENTED, f"grpc-encoding {encoding.decode()} is not supported")
        raise Abort(Code.INTERNAL, "a compressed message without grpc-encoding")
    return body[5:]


class Server:
    """Serves ``methods`` on the unix sockets given to :meth:`add_address`."""

    def __init__(self, methods: Iterable[Method], *, max_workers: int = 16, name: str = "rpc"):
        self.methods = {method.path: method for method in methods}
        self.pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        self._name = name
        self._listeners: list[socket.socket] = []
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def add_address(self, address: str) -> None:
        """Listen on ``unix:PATH`` (bound at once, served from :meth:`start`)."""
        if not address.startswith("unix:"):
            raise ValueError(f"only unix: addresses are served, got {address!r}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(address.removeprefix("unix:"))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        self._listeners.append(listener)

    def start(self) -> None:
        for listener in self._listeners:
            threading.Thread(
                target=self._accept, args=(listener,), name=f"{self._name}-accept", daemon=True
            ).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed by stop()
            connection = _Connection(self, sock)
            with self._lock:
                if self._stopping:
                    sock.close()
                    return
                self._connections.add(connection)
            threading.Thread(target=connection.run, name=f"{self._name}-conn", daemon=True).start()

    def forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def stop(self, grace: float) -> None:
        """Stop accepting, refuse new calls, give those in flight ``grace`` seconds, close."""
        with self._lock:
            self._stopping = True
            connections = list(self._connections)
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
            listener.close()
        for connection in connections:
            connection.go_away()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not all(c.idle() for c in connections):
            time.sleep(0.01)
        for connection in connections:
            connection.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
