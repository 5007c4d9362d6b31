"""HTTP/1.1 for the emulator: one asyncio Protocol per connection, parsed by httptools.

Keep-alive, requests served in order (pipelined ones wait their turn), chunked transfer for streams, TCP_NODELAY.
The application (`server.SimApp`) gets each complete request through `dispatch(conn, req)` and answers with
`conn.respond(...)` or by writing a stream and calling `conn.done(req)`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from email.utils import formatdate
from http import HTTPStatus

import httptools

_REASON = {s.value: s.phrase for s in HTTPStatus}
CHUNKED_END = b"0\r\n\r\n"
HEX = [b"%x\r\n" % i for i in range(1 << 14)]  # chunk-size lines of the chunked encoding, formatted once


class _DateCache:
    """The `date` header changes once a second; format it once a second."""

    __slots__ = ("sec", "value")

    def __init__(self):
        self.sec = -1
        self.value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self.sec:
            self.sec = now
            self.value = formatdate(now, usegmt=True).encode()
        return self.value


_date = _DateCache()


def head(
    status: int, content_type: bytes | None, length: int | None, extra: list[tuple[str, str]] | None = None
) -> bytes:
    parts = [
        b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\n"
        % (status, _REASON.get(status, "").encode(), _date.get())
    ]
    # uvicorn's order: content-length, the app's headers (content type, then `vary: Origin` from the CORS
    # middleware SGLang installs with allow_origins=["*"]: on every answer), transfer-encoding last
    if length is not None:
        parts.append(b"content-length: %d\r\n" % length)
    if content_type:
        parts.append(b"content-type: " + content_type + b"\r\n")
    parts.append(b"vary: Origin\r\n")
    if length is None:
        parts.append(b"transfer-encoding: chunked\r\n")
    for k, v in extra or ():
        parts.append(f"{k}: {v}\r\n".encode("latin-1"))
    parts.append(b"\r\n")
    return b"".join(parts)


JSON = b"application/json"
SSE = b"text/event-stream; charset=utf-8"
TEXT = b"text/plain; charset=utf-8"
PROM = b"text/plain; version=0.0.4; charset=utf-8"


# Methods per route, as SGLang's FastAPI app declares them (anything else: 405); unlisted routes are GET.
METHODS = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/generate": ("POST", "PUT"),
    "/flush_cache": ("GET", "POST"),
    "/abort_request": ("POST",),
    "/sim/gpu": ("GET", "POST"),
    "/sim/fault": ("GET", "POST"),
}


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "recv_ns")

    def __init__(self, method, path, query, headers, body, keep_alive):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.recv_ns = time.monotonic_ns()


class HttpError(Exception):
    def __init__(self, status: int, body: bytes, content_type: bytes = JSON):
        self.status, self.body, self.content_type = status, body, content_type


class Connection(asyncio.Protocol):
    __slots__ = (
        "app",
        "transport",
        "parser",
        "_url",
        "_headers",
        "_body",
        "queue",
        "busy",
        "closed",
        "active",
    )
    transport: asyncio.Transport  # set by connection_made, which asyncio calls before any other callback

    def __init__(self, app):
        self.app = app
        self.parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.queue: list[Request] = []
        self.busy = False
        self.closed = False
        self.active = None  # the stream being served, to abort it if the client goes away

    # --- asyncio
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes):
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fatal(400, b"Upgrade not supported")
        except httptools.HttpParserError as e:
            self._fatal(400, f"Invalid HTTP request: {e}".encode())

    def connection_lost(self, exc):
        self.closed = True
        s = self.active
        if s is not None:
            self.active = None
            s.client_gone()

    def _fatal(self, status: int, msg: bytes):
        if not self.closed:
            self.transport.write(head(status, TEXT, len(msg), [("connection", "close")]) + msg)
            self.transport.close()
            self.closed = True

    # --- httptools callbacks
    def on_message_begin(self):
        self._url = b""
        self._headers = {}
        self._body = []

    def on_url(self, url: bytes):
        self._url += url

    def on_header(self, name: bytes, value: bytes):
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes):
        self._body.append(body)

    def on_message_complete(self):
        u = httptools.parse_url(self._url)
        req = Request(
            self.parser.get_method().decode(),
            u.path.decode("latin-1"),
            (u.query or b"").decode("latin-1"),
            self._headers,
            b"".join(self._body),
            self.parser.should_keep_alive(),
        )
        if self.busy:
            self.queue.append(req)
        else:
            self.busy = True
            self.app.dispatch(self, req)

    # --- responses
    def respond(self, req: Request, status: int, body: bytes, ctype: bytes | None = JSON, extra=None):
        if self.closed:
            return
        self.transport.write(head(status, ctype, len(body), extra) + body)
        self.done(req)

    def done(self, req: Request):
        """The response to `req` is complete: serve the next pipelined request, or close."""
        self.active = None
        if self.closed:
            return
        if not req.keep_alive:
            self.transport.close()
            self.closed = True
            return
        if self.queue:
            nxt = self.queue.pop(0)
            self.app.dispatch(self, nxt)
        else:
            self.busy = False
