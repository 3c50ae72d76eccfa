"""A fault-injecting TCP proxy on 127.0.0.1, between a client under test and a real server
(the moto S3 server, ZooKeeper), controlled by the test through methods on the object.

Two modes:
  * ``tcp`` — bytes are relayed as they come (ZooKeeper, or any protocol). Faults:
    latency per relayed chunk, a bandwidth limit, `reset_all` (RST every open connection)
    and `partition` (nothing moves in either direction, new connections are accepted but
    not served; what was sent waits in the kernel's buffers, as in a real partition,
    until `heal`).
  * ``http`` — the proxy reads each HTTP/1.1 request itself (one request per connection:
    it asks the server to close after the response and tells the client the same), so
    it can also answer the next N requests with a 5xx without forwarding them
    (`fail_requests`), reset the next N connections once their request head has arrived
    (`reset_requests`), and cut the next upload part-way through its body
    (`cut_upload`: forward some bytes of the body, then stall until healed, or close, or
    reset), or forward the next N requests whole and RST the client instead of relaying
    the answer (`lose_responses`: the request landed, the client cannot know). Latency,
    bandwidth and `partition` apply as in tcp mode. Request bodies come
    with a ``Content-Length`` or ``Transfer-Encoding: chunked`` (as Hadoop's s3a sends
    them): a chunked body is relayed as it is, its framing read only to find its end (a
    cut counts the framed bytes).

Written with threads and blocking sockets rather than asyncio so a synchronous test can
drive it directly; it serves a handful of connections at a time, which is all tests need.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Mode = Literal["tcp", "http"]
CutAction = Literal["stall", "close", "reset"]

CHUNK = 16 * 1024

#: The body of an injected S3 error (S3's own XML shape, so clients parse it as S3's).
S3_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>injected by the test proxy</Message><RequestId>fault</RequestId></Error>"
)
S3_CODES = {500: "InternalError", 503: "SlowDown"}


@dataclass
class _Cut:
    after_bytes: int
    action: CutAction
    min_body: int


class _ChunkedBody:
    """Finds the end of a ``Transfer-Encoding: chunked`` body in the bytes fed to it (the
    framing: ``<hex size>[;ext]\\r\\n<data>\\r\\n`` ..., ``0\\r\\n``, trailers, an empty line)."""

    def __init__(self) -> None:
        self._line = bytearray()
        self._left = 0  # bytes of the current chunk's data and its CRLF still to come
        self._state: Literal["size", "data", "trailer"] = "size"

    def feed(self, data: bytes) -> int | None:
        """The index in `data` just past the body's end, or None if it goes on."""
        i = 0
        while i < len(data):
            if self._state == "data":
                take = min(self._left, len(data) - i)
                i += take
                self._left -= take
                if self._left == 0:
                    self._state = "size"
                continue
            newline = data.find(b"\n", i)
            if newline < 0:
                self._line += data[i:]
                return None
            self._line += data[i : newline + 1]
            i = newline + 1
            line = bytes(self._line).strip()
            self._line.clear()
            if self._state == "trailer":
                if not line:
                    return i
                continue
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                self._state = "trailer"
            else:
                self._state, self._left = "data", size + 2
        return None


class _Closed(Exception):
    """A side of a connection went away (an ordinary end, not a test failure)."""


def _rst(sock: socket.socket) -> None:
    """Close with a TCP RST (linger 0) instead of an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class FaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to `target` ("host", port)."""

    def __init__(self, target: tuple[str, int], mode: Mode = "tcp") -> None:
        self.target = target
        self.mode = mode
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._unstalled = threading.Event()
        self._unstalled.set()
        self._stopped = threading.Event()
        self._latency = 0.0
        self._rate: float | None = None
        self._fail: list[int] = []
        self._resets = 0
        self._lost = 0
        self._cut: _Cut | None = None
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)  # so `close` ends the accept loop promptly
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    # -- addresses ---------------------------------------------------------------------
    @property
    def hosts(self) -> str:
        """``host:port`` (a ZooKeeper connect string)."""
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """``http://host:port`` (an S3 endpoint)."""
        return f"http://127.0.0.1:{self.port}"

    # -- faults ------------------------------------------------------------------------
    def set_latency(self, seconds: float) -> None:
        """Delay every relayed chunk (and, in http mode, every request) this long."""
        self._latency = seconds

    def set_bandwidth(self, bytes_per_second: float | None) -> None:
        """Limit each direction of each connection to this rate (None: no limit)."""
        self._rate = bytes_per_second

    def fail_requests(self, n: int, status: int = 503) -> None:
        """http mode: answer the next `n` requests with `status` without forwarding."""
        self._need_http()
        with self._lock:
            self._fail.extend([status] * n)

    def reset_requests(self, n: int) -> None:
        """http mode: RST the next `n` connections once their request head arrived."""
        self._need_http()
        with self._lock:
            self._resets += n

    def lose_responses(self, n: int) -> None:
        """http mode: forward the next `n` requests with a body whole, let the server
        answer, then RST the client instead of relaying the answer."""
        self._need_http()
        with self._lock:
            self._lost += n

    def cut_upload(self, after_bytes: int, action: CutAction, min_body: int = 1) -> None:
        """http mode: the next request whose body has at least `min_body` bytes gets
        `after_bytes` of it forwarded; then the proxy stalls (until `heal`), closes
        (FIN both sides) or resets (RST both sides)."""
        self._need_http()
        with self._lock:
            self._cut = _Cut(after_bytes, action, min_body)

    def reset_all(self) -> None:
        """RST every connection open now (both sides)."""
        with self._lock:
            sockets, self._open = set(self._open), set()
        for sock in sockets:
            _rst(sock)
        self.counts["reset_all"] += len(sockets)

    def partition(self) -> None:
        """Nothing moves in either direction until `heal` (connections stay open)."""
        self._flowing.clear()

    def heal(self) -> None:
        """End every fault: the partition, stalled uploads, pending 5xx and resets,
        latency and bandwidth limits."""
        with self._lock:
            self._fail.clear()
            self._resets = 0
            self._lost = 0
            self._cut = None
        self._latency = 0.0
        self._rate = None
        self._flowing.set()
        self._unstalled.set()

    def close(self) -> None:
        self._stopped.set()
        self.heal()
        self._thread.join(5)
        self._listener.close()
        self.reset_all()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _need_http(self) -> None:
        if self.mode != "http":
            raise AssertionError("this fault needs a proxy in http mode")

    # -- plumbing ----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self.counts["connections"] += 1
            handler: Callable[[socket.socket], None] = (
                self._serve_http if self.mode == "http" else self._serve_tcp
            )
            threading.Thread(target=self._run, args=(handler, client), daemon=True).start()

    def _run(self, handler: Callable[[socket.socket], None], client: socket.socket) -> None:
        self._track(client)
        try:
            handler(client)
        except (_Closed, OSError):
            pass
        finally:
            self._untrack(client)
            client.close()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)

    def _wait_flowing(self) -> None:
        while not self._flowing.wait(0.1):
            if self._stopped.is_set():
                raise _Closed

    def _connect(self) -> socket.socket:
        self._wait_flowing()
        upstream = socket.create_connection(self.target, timeout=10)
        upstream.settimeout(None)
        self._track(upstream)
        return upstream

    def _send(self, sock: socket.socket, data: bytes) -> None:
        """Send with the current latency, bandwidth and partition applied."""
        self._wait_flowing()
        if self._latency:
            time.sleep(self._latency)
        rate = self._rate
        if rate is None:
            sock.sendall(data)
            return
        step = max(1, int(rate / 20))
        for i in range(0, len(data), step):
            self._wait_flowing()
            piece = data[i : i + step]
            sock.sendall(piece)
            time.sleep(len(piece) / rate)

    def _recv(self, sock: socket.socket) -> bytes:
        self._wait_flowing()
        data = sock.recv(CHUNK)
        if not data:
            raise _Closed
        return data

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._send(dst, self._recv(src))
        except (_Closed, OSError):
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _serve_tcp(self, client: socket.socket) -> None:
        upstream = self._connect()
        try:
            back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
            back.start()
            self._pump(client, upstream)
            back.join()
        finally:
            self._untrack(upstream)
            upstream.close()

    # -- http mode ---------------------------------------------------------------------
    def _read_head(self, sock: socket.socket, buffer: bytearray) -> bytes:
        while b"\r\n\r\n" not in buffer:
            buffer += self._recv(sock)
        end = buffer.index(b"\r\n\r\n") + 4
        head = bytes(buffer[:end])
        del buffer[:end]
        return head

    def _serve_http(self, client: socket.socket) -> None:
        buffer = bytearray()
        head = self._read_head(client, buffer)
        lines = head.decode("latin-1").split("\r\n")
        fields = (ln.partition(":") for ln in lines[1:] if ln)
        headers = {k.strip().lower(): v.strip() for k, _, v in fields}
        self.counts["requests"] += 1
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = int(headers.get("content-length", "0") or 0)
        if chunked:  # the size of what is framed, where the client says it (AWS SDKs do)
            length = int(headers.get("x-amz-decoded-content-length", "0") or 0) or CHUNK
        expects = headers.get("expect", "").lower() == "100-continue"
        with self._lock:
            status = self._fail.pop(0) if self._fail else None
            reset = self._resets > 0 and status is None
            if reset:
                self._resets -= 1
            cut = self._cut if (status is None and not reset and self._cut
                                and length >= self._cut.min_body) else None
            if cut is not None:
                self._cut = None
            lose = (status is None and not reset and cut is None and self._lost > 0
                    and (length > 0 or chunked))
            if lose:
                self._lost -= 1
        if self._latency:
            time.sleep(self._latency)
        if reset:
            self.counts["reset"] += 1
            self._untrack(client)
            _rst(client)
            return
        if status is not None:
            self.counts[f"status_{status}"] += 1
            if not expects:  # read (and drop) the body the client sends anyway
                self._drain_body(client, buffer, length, chunked)
            body = S3_ERROR.format(code=S3_CODES.get(status, "InternalError")).encode()
            client.sendall(
                f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            return
        if expects:
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        kept = [ln for ln in lines[1:] if ln and ln.split(":", 1)[0].strip().lower()
                not in ("connection", "expect")]
        out_head = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
        upstream = self._connect()
        try:
            self._send(upstream, out_head)
            self._relay_body(client, upstream, buffer, None if chunked else length, cut)
            if lose:
                self._lose_response(upstream, client)
                return
            self._relay_response(upstream, client)
        finally:
            self._untrack(upstream)
            upstream.close()

    def _drain_body(
        self, client: socket.socket, buffer: bytearray, length: int, chunked: bool
    ) -> None:
        if chunked:
            scanner = _ChunkedBody()
            data = bytes(buffer)
            while scanner.feed(data) is None:
                data = self._recv(client)
            return
        remaining = length - len(buffer)
        while remaining > 0:
            remaining -= len(self._recv(client))

    def _relay_body(
        self, client: socket.socket, upstream: socket.socket, buffer: bytearray,
        length: int | None, cut: _Cut | None,
    ) -> None:
        """Forward the request body: `length` bytes, or (None) a chunked body to its end.
        With `cut`, only its first `after_bytes` go; a body that ends before that leaves
        the cut for the next upload."""
        scanner = _ChunkedBody() if length is None else None
        sent = 0
        while length is None or sent < length:
            data = bytes(buffer) if buffer else self._recv(client)
            buffer.clear()
            ended = False
            if scanner is not None:
                end = scanner.feed(data)
                if end is not None:
                    data, ended = data[:end], True
            if cut is not None and sent + len(data) > cut.after_bytes:
                data, ended = data[: max(0, cut.after_bytes - sent)], False
            if data:
                self._send(upstream, data)
                sent += len(data)
            if cut is not None and sent >= cut.after_bytes:
                self._cut_now(client, upstream, cut.action)
            if ended:
                break
        if cut is not None:
            with self._lock:  # the body was shorter than the cut: the next one gets it
                self._cut = self._cut or cut

    def _cut_now(self, client: socket.socket, upstream: socket.socket, action: CutAction) -> None:
        self.counts[f"cut_{action}"] += 1
        if action == "stall":
            self._unstalled.clear()
            while not self._unstalled.wait(0.1):  # until heal (or the client gives up)
                if self._stopped.is_set():
                    break
            action = "close"
        self._untrack(upstream)
        self._untrack(client)
        if action == "reset":
            _rst(upstream)
            _rst(client)
        else:
            upstream.close()
            client.close()
        raise _Closed

    def _lose_response(self, upstream: socket.socket, client: socket.socket) -> None:
        """Wait for the server's whole answer (the request took effect), then RST the
        client without a byte of it."""
        buffer = bytearray()
        self._read_head(upstream, buffer)
        with contextlib.suppress(_Closed, OSError):
            while True:
                self._recv(upstream)
        self.counts["lost_response"] += 1
        self._untrack(client)
        _rst(client)
        raise _Closed

    def _relay_response(self, upstream: socket.socket, client: socket.socket) -> None:
        buffer = bytearray()
        head = self._read_head(upstream, buffer)
        lines = head.decode("latin-1").split("\r\n")
        kept = [ln for ln in lines[1:]
                if ln and ln.split(":", 1)[0].strip().lower() != "connection"]
        out_head = "\r\n".join([lines[0], *kept, "Connection: close", "", ""])
        self._send(client, out_head.encode("latin-1"))
        if buffer:
            self._send(client, bytes(buffer))
        try:
            while True:
                self._send(client, self._recv(upstream))
        except _Closed:
            pass
        client.shutdown(socket.SHUT_WR)
