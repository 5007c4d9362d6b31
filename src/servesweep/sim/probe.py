"""A small, fast streaming client for measuring the emulator itself (tests and `bench/bench_sim.py`).

Raw asyncio sockets + httptools: one connection per request, arrival time (`time.monotonic_ns()`) of every SSE
event that carries tokens. It is not the product's load generator (that is Locust); it exists so the emulator can
be checked and benchmarked without depending on it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httptools


@dataclass
class ProbeResult:
    status: int = 0
    send_ns: int = 0
    headers_ns: int = 0
    events: list[tuple[int, bytes]] = field(
        default_factory=list
    )  # (arrival ns, raw event payload after "data: ")
    end_ns: int = 0
    body: bytes = b""
    error: str | None = None

    def token_events(self) -> list[tuple[int, dict]]:
        """(arrival ns, parsed chunk) of the chunks with non-empty content, reasoning or text."""
        out = []
        for t, raw in self.events:
            if raw == b"[DONE]":
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            ch = obj.get("choices") or []
            if ch:
                d = ch[0].get("delta") or {}
                if d.get("content") or d.get("reasoning_content") or ch[0].get("text"):
                    out.append((t, obj))
            elif "text" in obj and obj.get("text"):
                out.append((t, obj))
        return out

    @property
    def ttft_s(self) -> float | None:
        te = self.token_events()
        return (te[0][0] - self.send_ns) / 1e9 if te else None

    def itls_s(self) -> list[float]:
        te = self.token_events()
        return [(te[i][0] - te[i - 1][0]) / 1e9 for i in range(1, len(te))]

    def json_events(self) -> list[dict]:
        out = []
        for _, raw in self.events:
            if raw != b"[DONE]":
                out.append(json.loads(raw))
        return out


class _Proto(asyncio.Protocol):
    def __init__(self, res: ProbeResult, done: asyncio.Future):
        self.res = res
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.buf = b""
        self.body: list[bytes] = []

    def data_received(self, data):
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._finish(f"parse error: {e}")

    def connection_lost(self, exc):
        self._finish("connection closed before the response ended")

    def on_headers_complete(self):
        self.res.status = self.parser.get_status_code()
        self.res.headers_ns = time.monotonic_ns()

    def on_body(self, body: bytes):
        now = time.monotonic_ns()
        self.body.append(body)
        self.buf += body
        while True:
            i = self.buf.find(b"\n\n")
            if i < 0:
                break
            ev, self.buf = self.buf[:i], self.buf[i + 2 :]
            if ev.startswith(b"data: "):
                self.res.events.append((now, ev[6:]))

    def on_message_complete(self):
        self._finish(None)

    def _finish(self, err):
        if not self.done.done():
            self.res.end_ns = time.monotonic_ns()
            self.res.body = b"".join(self.body)
            if err:
                self.res.error = err
            self.done.set_result(None)


async def probe(
    host: str,
    port: int,
    path: str,
    payload: dict,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> ProbeResult:
    loop = asyncio.get_running_loop()
    res = ProbeResult()
    done = loop.create_future()
    body = json.dumps(payload).encode()
    hdr = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    req = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{hdr}connection: close\r\n\r\n"
    ).encode() + body
    transport, _ = await loop.create_connection(lambda: _Proto(res, done), host, port)
    res.send_ns = time.monotonic_ns()
    transport.write(req)
    try:
        await asyncio.wait_for(done, timeout)
    except TimeoutError:
        res.error = f"timeout after {timeout} s"
    finally:
        transport.close()
    return res


async def probe_many(host: str, port: int, path: str, payloads: list[dict], **kw) -> list[ProbeResult]:
    return list(await asyncio.gather(*(probe(host, port, path, p, **kw) for p in payloads)))


def run(coro):
    """Run a probe coroutine on a fresh uvloop event loop."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


# ---------------------------------------------------------------- small synchronous helpers (tests, scripts)


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 30):
    """(status, headers, body bytes) of one plain HTTP request; error statuses are returned, not raised."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post_json(url: str, obj: dict, headers: dict | None = None, timeout: float = 30):
    return http(
        "POST",
        url,
        json.dumps(obj).encode(),
        {"content-type": "application/json", **(headers or {})},
        timeout,
    )


def sse_events(body: bytes) -> list[bytes]:
    """The payloads of a whole SSE body (`data: X\\n\\n` ...), checking its framing."""
    if not body.endswith(b"\n\n"):
        raise ValueError(f"SSE body does not end with a blank line: {body[-200:]!r}")
    events = body[:-2].split(b"\n\n")
    for e in events:
        if not e.startswith(b"data: "):
            raise ValueError(f"SSE event without 'data: ': {e[:200]!r}")
    return [e[6:] for e in events]
