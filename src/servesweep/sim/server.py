"""The emulator's HTTP server: asyncio + uvloop + httptools, speaking SGLang's HTTP surface.

One `asyncio.Protocol` per connection parses HTTP/1.1 with httptools (keep-alive, requests served in order).
Generation requests are tokenized, validated like SGLang's tokenizer manager, and handed to the discrete-event
engine (`servesweep.sim.engine`); the engine calls back once per step per request, and each callback writes exactly
one chunk with one `transport.write` built from bytes prepared when the request arrived (no JSON encoding, no
logging per chunk). Everything that is not per-chunk (bodies, errors, /server_info, /metrics) is plain code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from email.utils import formatdate
from http import HTTPStatus
from time import monotonic_ns

import httptools

from . import protocol as P
from .faults import PRE_STREAM, FaultPicker

log = logging.getLogger("servesweep.sim")

_REASON = {s.value: s.phrase for s in HTTPStatus}
_EAGLE_FAMILY_CHECK = None  # reserved tokens come from hardware.resolve_server (num_reserved_tokens)
CHUNKED_END = b"0\r\n\r\n"
NON_STREAM_FAULTS = ("disconnect", "error_event", "stall", "malformed")
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
    if length is not None:
        parts.append(b"content-length: %d\r\n" % length)
    else:
        parts.append(b"transfer-encoding: chunked\r\n")
    if content_type:
        parts.append(b"content-type: " + content_type + b"\r\n")
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


# ====================================================================== connection


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

    def __init__(self, app: SimApp):
        self.app = app
        self.transport = None
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


# ====================================================================== generation streams


class Gen:
    """One generation request: its engine request, its bytes, its fault and its ground-truth record."""

    __slots__ = (
        "app", "conn", "req", "ereq", "rid", "gt_id", "kind", "stream", "model", "created", "fmt", "wt", "word",
        "pending", "interval", "reasoning_left", "reasoning", "prompt_tokens", "include_usage", "continuous",
        "cache_report", "chunks", "sched", "chunks_written", "fault", "stall_until", "held_finish", "done",
        "headers_ns", "text_parts", "output_ids", "ignore", "legacy", "t_recv", "max_new", "client_gone_flag",
        "endpoint", "final_written", "eng", "fast", "hp", "mt", "base_len",
    )  # fmt: skip

    def __init__(self, app, conn, req, kind, stream, model, prompt_tokens, max_new, fault, rid, body):
        self.app = app
        self.conn = conn
        self.req = req
        self.kind = kind  # "chat" | "completion" | "generate"
        self.endpoint = req.path
        self.stream = stream
        self.model = model
        self.created = int(time.time())
        self.rid = rid
        self.gt_id = req.headers.get("x-request-id") or rid
        self.wt = app.words
        self.word = hash(rid) % self.wt.n
        self.pending = 0
        self.interval = max(1, app.args.stream_interval)
        self.prompt_tokens = prompt_tokens
        self.max_new = max_new
        self.legacy = app.legacy
        so = body.get("stream_options") or {}
        self.include_usage = bool(so.get("include_usage")) or app.args.stream_response_default_include_usage
        self.continuous = bool(so.get("continuous_usage_stats"))
        self.cache_report = app.args.enable_cache_report
        self.reasoning = 0
        self.reasoning_left = 0
        if kind == "chat" and app.args.reasoning_parser and body.get("separate_reasoning", True):
            ctk = body.get("chat_template_kwargs") or {}
            if ctk.get("enable_thinking", True) is not False:
                # the first half of the budget is thinking, the rest the answer
                self.reasoning_left = max_new // 2
        self.chunks: list | None = [] if app.record_chunks else None
        self.sched: list | None = [] if app.gt is not None else None
        self.chunks_written = 0
        self.fault = fault
        self.stall_until = 0.0
        self.held_finish = False
        self.done = False
        self.headers_ns = 0
        self.text_parts: list[str] | None = [] if (kind == "generate" or not stream) else None
        self.output_ids: list[int] | None = [] if kind == "generate" else None
        self.ignore = False
        self.t_recv = req.recv_ns
        self.client_gone_flag = False
        self.ereq = None
        self.final_written = False
        if kind == "chat":
            self.fmt = P.ChatChunks(rid, self.created, model, self.legacy)
        elif kind == "completion":
            self.fmt = P.CompletionChunks(rid, self.created, model)
        else:
            self.fmt = None
        self.eng = app.engine
        # The common case (a plain token chunk of a chat/completion stream) has its own short path in
        # on_tokens: the chunk is [hex length] + hp + words + mt, nothing else is computed per chunk.
        self.fast = (
            stream
            and kind in ("chat", "completion")
            and fault is None
            and not self.continuous
            and self.reasoning_left == 0
            and self.interval == 1
            and not self.legacy
        )
        if self.fast:
            f = self.fmt
            if kind == "chat":
                self.hp = f.head + f.content_pre
                self.mt = f.mid + f.tail + b"\r\n"
            else:
                self.hp = f.head + b'{"index":0,"text":"'
                self.mt = f.tail + b',"usage":null}\n\n\r\n'
            self.base_len = len(self.hp) + len(self.mt) - 2

    # ------------------------------------------------------------------ engine callback (hot path)

    def on_tokens(self, ereq, n: int, finished: bool) -> None:
        if self.fast and self.chunks_written and n and not finished:
            wt = self.wt
            if n <= wt.n:
                w = self.word
                offs = wt.offsets
                text = wt.blob[offs[w] : offs[w + n]]
                w += n
                self.word = w if w < wt.n else w - wt.n
                ch = self.chunks
                if ch is not None:
                    ch.append((monotonic_ns(), n))
                    sc = self.sched
                    if sc is not None:
                        eng = self.eng
                        sc.append(eng._t0 + eng._vt)
                size = self.base_len + len(text)
                if size < 16384:
                    self.conn.transport.write(HEX[size] + self.hp + text + self.mt)
                else:
                    self.conn.transport.write(b"%x\r\n%b%b%b" % (size, self.hp, text, self.mt))
                self.chunks_written += 1
                return
        if self.done:
            return
        if n:
            self.pending += n
        if self.stall_until:
            if finished:
                self.held_finish = True
            return
        if self.pending >= self.interval or (finished and self.pending):
            if not self.stream:
                self._absorb()
            else:
                self._write_tokens(finished)
                if self.done:
                    return
        if finished:
            self._finish()

    def _absorb(self):
        """Non-stream: keep the text for the final body."""
        n = self.pending
        self.pending = 0
        self._take_text(n)

    def _take_text(self, n: int):
        """Advance the word cursor by n tokens; returns (reasoning_bytes, content_bytes) of these tokens."""
        r = 0
        if self.reasoning_left:
            r = min(n, self.reasoning_left)
            self.reasoning_left -= r
            self.reasoning += r
        wt = self.wt
        w = self.word
        rb = (wt.text_bytes(w, r) if r <= wt.n else wt.text(w, r).encode()) if r else b""
        c = n - r
        cb = (wt.text_bytes(w + r, c) if c <= wt.n else wt.text(w + r, c).encode()) if c else b""
        if self.output_ids is not None:
            self.output_ids.extend(wt.token_ids(w, n))
        if self.text_parts is not None:
            self.text_parts.append((rb + cb).decode() if self.kind != "chat" else "")
            if self.kind == "chat":  # non-stream chat keeps reasoning apart
                self.text_parts[-1] = (rb.decode(), cb.decode())
        self.word = (w + n) % wt.n
        return rb, cb

    def _write_tokens(self, finished: bool):
        conn = self.conn
        if conn.closed:
            return
        n = self.pending
        self.pending = 0
        ereq = self.ereq
        completion = ereq.completion_tokens if ereq is not None else 0
        rb, cb = self._take_text(n)
        kind = self.kind
        f = self.fault
        if kind == "chat":
            fmt = self.fmt
            usage = b""
            if self.continuous:
                usage = b',"usage":' + P.dumps(self._usage(completion))
            parts = []
            if self.chunks_written == 0:
                parts.append(fmt.role_event)
            if rb:
                parts.append(fmt.reasoning(rb, usage))
            if cb:
                parts.append(fmt.content(cb, usage))
            payload = b"".join(parts)
        elif kind == "completion":
            usage = b',"usage":' + P.dumps(self._usage(completion)) if self.continuous else b""
            if finished and ereq is not None and ereq.finish_reason != "abort":
                payload = self.fmt.last(cb, ereq.finish_reason, self._matched(ereq), usage)
            else:
                payload = self.fmt.content(cb, usage)
        else:  # native /generate: the event that carries the last tokens is the final one (finish_reason set)
            self.final_written = finished and ereq is not None and ereq.finish_reason != "abort"
            payload = self._generate_event(finished=self.final_written)
        if f is not None and f.kind == "malformed" and self.chunks_written == int(f.arg):
            payload += (
                b'data: {"id":"%s","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"con\n\n'
                % (self.rid.encode())
            )
        data = b"%x\r\n%s\r\n" % (len(payload), payload)
        if (
            self.chunks is not None
        ):  # the write time is taken just before the write: a client never sees it earlier
            self.chunks.append((monotonic_ns(), n))
            if self.sched is not None:
                self.sched.append(self.app.engine_sched())
        conn.transport.write(data)
        self.chunks_written += 1
        if f is not None:
            k = f.kind
            if k == "disconnect" and self.chunks_written >= int(f.arg):
                self._fault_disconnect()
            elif k == "error_event" and self.chunks_written >= int(f.arg):
                self._fault_error_event()
            elif k == "stall" and self.chunks_written == 1 and not finished:
                self.stall_until = time.monotonic() + f.arg
                self.app.loop.call_later(f.arg, self._unstall)

    def _unstall(self):
        self.stall_until = 0.0
        if self.done:
            return
        fin = self.held_finish
        if self.pending:
            if not self.stream:
                self._absorb()
            else:
                self._write_tokens(fin)
                if self.done:
                    return
        if fin:
            self._finish()

    # ------------------------------------------------------------------ pieces

    def _matched(self, ereq):
        return self.app.eos_id if ereq.finish_reason == "stop" else None

    def _usage(self, completion: int) -> dict:
        cached = self.ereq.cached_tokens if self.ereq is not None else 0
        return P.usage_dict(
            self.prompt_tokens,
            completion,
            cached,
            self.reasoning,
            cache_report=self.cache_report,
            legacy=self.legacy,
        )

    def _meta(self, finished: bool) -> dict:
        e = self.ereq
        comp = e.completion_tokens if e is not None else 0
        m = {
            "id": self.rid,
            "finish_reason": None,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            ("num_retractions" if self.app.version >= (0, 5, 12) else "total_retractions"): getattr(
                e, "retractions", 0
            )
            if e is not None
            else 0,
            "reasoning_tokens": 0,
            "completion_tokens": comp,
            "cached_tokens": e.cached_tokens if e is not None else 0,
        }
        if finished and e is not None:
            abort = (e.abort_message, e.abort_status) if e.finish_reason == "abort" else None
            m["finish_reason"] = P.finish_reason_obj(e.finish_reason, comp, self.app.eos_id, abort)
            m["e2e_latency"] = (time.monotonic_ns() - self.t_recv) / 1e9
            if self.app.resolved.spec_algorithm and e.spec_verify_ct:
                acc = comp / e.spec_verify_ct
                nd = self.app.resolved.spec_num_draft_tokens or 1
                m["spec_accept_rate"] = (acc - 1) / max(1, nd - 1)
                m["spec_accept_length"] = acc
                m["spec_num_correct_drafts"] = comp - e.spec_verify_ct
                m["spec_num_proposed_drafts"] = e.spec_verify_ct * max(1, nd - 1)
                m["spec_verify_ct"] = e.spec_verify_ct
            m["response_sent_to_client_ts"] = time.time()
        return m

    def _generate_event(self, finished: bool) -> bytes:
        obj = {
            "text": "".join(self.text_parts),
            "output_ids": self.output_ids,
            "meta_info": self._meta(finished),
        }
        return b"data: " + P.dumps(obj) + b"\n\n"

    # ------------------------------------------------------------------ endings

    def _finish(self):
        """The engine finished this request (length, stop, abort, or scheduler-side error)."""
        self.done = True
        self.fast = False
        e = self.ereq
        conn = self.conn
        status = 200
        if e is not None and e.finish_reason == "abort" and e.abort_status:
            status = e.abort_status
            msg = e.abort_message or "Aborted"
            if self.stream and self.legacy and self.kind == "chat":
                # ≤0.5.9: a normal chunk with finish_reason "abort" instead of an error event
                self._write_end(self.fmt.finish("abort", None) + P.DONE)
            elif self.stream:
                self._write_end(P.stream_error_event(msg, status) + P.DONE)
            else:
                self._respond_body(status, P.error_body(msg, status))
        elif self.stream:
            if self.kind == "chat":
                reason = e.finish_reason or "abort"
                out = []
                if self.chunks_written == 0:
                    out.append(self.fmt.role_event)
                out.append(self.fmt.finish(reason, self._matched(e)))
                if self.include_usage:
                    out.append(self.fmt.usage(self._usage(e.completion_tokens)))
                out.append(P.DONE)
                self._write_end(b"".join(out))
            elif self.kind == "completion":
                out = []
                if e.finish_reason == "abort" or self.chunks_written == 0:
                    out.append(self.fmt.last(b"", e.finish_reason or "abort", None))
                if self.include_usage:
                    out.append(self.fmt.usage(self._usage(e.completion_tokens)))
                out.append(P.DONE)
                self._write_end(b"".join(out))
            elif self.final_written:
                self._write_end(P.DONE)
            else:
                self._write_end(self._generate_event(finished=True) + P.DONE)
        elif self.fault is not None and self.fault.kind in NON_STREAM_FAULTS:
            self._nonstream_fault(self.fault)
            return
        else:
            self._respond_body(200, self._final_body())
        self._record(status)
        if not conn.closed:
            conn.done(self.req)

    def _nonstream_fault(self, f):
        """Mid-response faults of a non-streaming request, applied to its single body."""
        conn = self.conn
        if f.kind == "disconnect":
            if not conn.closed:
                conn.closed = True
                conn.active = None
                conn.transport.close()
            self._record(200)
            return
        if f.kind == "stall":

            def late():
                self._respond_body(200, self._final_body())
                self._record(200)
                if not conn.closed:
                    conn.done(self.req)

            self.app.loop.call_later(f.arg, late)
            return
        if f.kind == "error_event":
            self._respond_body(500, P.error_body("Injected fault: error event", 500, "InternalServerError"))
            status = 500
        else:  # malformed: a truncated JSON body (its content-length is right)
            body = self._final_body()
            self._respond_body(200, body[: len(body) // 2])
            status = 200
        self._record(status)
        if not conn.closed:
            conn.done(self.req)

    def _final_body(self) -> bytes:
        e = self.ereq
        comp = e.completion_tokens
        reason = e.finish_reason or "abort"
        if self.kind == "chat":
            r = "".join(p[0] for p in self.text_parts)
            c = "".join(p[1] for p in self.text_parts)
            return P.chat_response(
                self.rid,
                self.created,
                self.model,
                c,
                r if self.app.args.reasoning_parser else None,
                reason,
                self._matched(e),
                self._usage(comp),
            )
        if self.kind == "completion":
            return P.completion_response(
                self.rid,
                self.created,
                self.model,
                "".join(self.text_parts),
                reason,
                self._matched(e),
                self._usage(comp),
            )
        return P.dumps(
            {"text": "".join(self.text_parts), "output_ids": self.output_ids, "meta_info": self._meta(True)}
        )

    def _write_end(self, payload: bytes):
        conn = self.conn
        if conn.closed:
            return
        conn.transport.write(b"%x\r\n%s\r\n%s" % (len(payload), payload, CHUNKED_END))

    def _respond_body(self, status: int, body: bytes):
        conn = self.conn
        if conn.closed:
            return
        if self.chunks is not None:
            self.chunks.append([time.monotonic_ns(), self.ereq.completion_tokens if self.ereq else 0])
        conn.transport.write(head(status, JSON, len(body)) + body)

    def _fault_disconnect(self):
        self.done = True
        self.fast = False
        self.conn.closed = True
        self.conn.active = None
        self.conn.transport.close()
        self.app.engine.abort(self.rid)
        self._record(200)

    def _fault_error_event(self):
        self.done = True
        self.fast = False
        self._write_end(P.stream_error_event("Injected fault: error event", 500) + P.DONE)
        self.app.engine.abort(self.rid)
        self._record(200)
        self.conn.done(self.req)

    def client_gone(self):
        """The client closed the connection: a graceful abort, as SGLang does on disconnect."""
        if self.done:
            return
        self.client_gone_flag = True
        self.app.engine.abort(self.rid)
        if not self.done:  # the engine's abort callback did not arrive synchronously
            self.done = True
            self.fast = False
            self._record(499)

    # ------------------------------------------------------------------ bookkeeping

    def _record(self, status: int):
        app = self.app
        app._active.pop(self.rid, None)
        e = self.ereq
        end = time.monotonic_ns()
        comp = e.completion_tokens if e is not None else 0
        cached = e.cached_tokens if e is not None else 0
        reason = "abort" if self.client_gone_flag else (e.finish_reason if e is not None else None)
        if app.metrics is not None and e is not None:
            itl = []
            ch = self.chunks
            if ch:
                for i in range(1, len(ch)):
                    if ch[i][1]:
                        itl.append(((ch[i][0] - ch[i - 1][0]) / 1e9, ch[i][1]))
            ttft = (ch[0][0] - self.t_recv) / 1e9 if ch else None
            qt = None
            if e.first_token_time is not None and e.queue_start:
                qt = None  # engine-clock queue time is not split out per request; SGLang's includes prefill wait
            app.metrics.on_finish(
                streaming=self.stream,
                prompt=self.prompt_tokens,
                completion=comp,
                cached=cached,
                ttft=ttft,
                e2e=(end - self.t_recv) / 1e9,
                queue_time=qt,
                itl=itl,
                finish_reason=reason,
                verify_ct=e.spec_verify_ct,
            )
        if app.gt is not None:
            rec = {
                "id": self.gt_id,
                "response_id": self.rid,
                "endpoint": self.endpoint,
                "stream": self.stream,
                "recv_ns": self.t_recv,
                "headers_ns": self.headers_ns,
                "chunks": self.chunks,
                "end_ns": end,
                "status": status,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": comp,
                "cached_tokens": cached,
                "finish_reason": reason,
                "fault": str(self.fault) if self.fault is not None else None,
            }
            if self.sched and all(t is not None for t in self.sched):
                rec["sched_ns"] = [int(t * 1e9) for t in self.sched]
            app.gt.add(rec)


# ====================================================================== the application


class SimApp:
    def __init__(self, args, resolved, engine_mod):
        from .cli import version_tuple

        self.args = args
        self.resolved = resolved
        self.version = version_tuple(args.sim_sglang_version)
        self.legacy = self.version < (0, 5, 10)
        self.engine_mod = engine_mod
        self.engine = engine_mod.Engine(
            resolved, seed=args.sim_seed, calibration=args.sim_calibration or None
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = False
        self.draining = False
        self.start_wall = time.time()
        self.served_model_name = args.served_model_name or args.model_path
        self.tokenizer = None
        self.words = None
        self.eos_id = 0
        self.faults = FaultPicker(args.sim_fault_rate or {}, args.sim_seed)
        self.gt = None
        if args.sim_ground_truth:
            from .groundtruth import GroundTruthWriter

            self.gt = GroundTruthWriter(args.sim_ground_truth)
        self.metrics = None
        if args.enable_metrics:
            from .metrics import SimMetrics

            self.metrics = SimMetrics(
                model_name=self.served_model_name,
                version=self.version,
                resolved=resolved,
                engine=self.engine,
                args=args,
            )
        self.record_chunks = self.gt is not None or self.metrics is not None
        self.routes = {
            "/health": self.h_health,
            "/health_generate": self.h_health,
            "/ready": self.h_ready,
            "/model_info": self.h_model_info,
            "/get_model_info": self.h_model_info,
            "/server_info": self.h_server_info,
            "/get_server_info": self.h_server_info,
            "/v1/models": self.h_models,
            "/v1/chat/completions": self.h_chat,
            "/v1/completions": self.h_completion,
            "/generate": self.h_generate,
            "/flush_cache": self.h_flush,
            "/abort_request": self.h_abort,
            "/metrics": self.h_metrics,
            "/v1/loads": self.h_loads,
            "/ping": self.h_ping,
        }
        self._active: dict[str, Gen] = {}  # rid -> request in flight (for /abort_request abort_all)
        self._sched_attr = None

    def engine_sched(self):
        """The engine's scheduled emission time of the step being emitted (monotonic seconds), when known."""
        fn = self._sched_attr
        return None if fn is None else fn()

    # ------------------------------------------------------------------ lifecycle

    def load(self):
        """The slow part of start-up (tokenizer, word table), run in a thread while the port already answers."""
        from servesweep.tokenizer import load_tokenizer

        from .text import build_word_table

        spec = self.args.tokenizer_path
        if spec is None and os.path.isfile(
            os.path.join(os.path.expanduser(self.args.model_path), "tokenizer.json")
        ):
            spec = self.args.model_path
        tok = load_tokenizer(spec)
        self.words = build_word_table(tok, seed=self.args.sim_seed)
        self.eos_id = tok.eos_token_id
        self.tokenizer = tok

    def dispatch(self, conn: Connection, req: Request):
        path = req.path
        handler = self.routes.get(path)
        if handler is None and path.startswith("/v1/models/"):
            handler = self.h_model
        status = 0
        try:
            if handler is None:
                status = 404
                conn.respond(req, 404, b'{"detail":"Not Found"}')
                return
            if req.method not in METHODS.get(path, ("GET",)):
                status = 405
                conn.respond(
                    req,
                    405,
                    b'{"detail":"Method Not Allowed"}',
                    JSON,
                    [("allow", ", ".join(METHODS.get(path, ("GET",))))],
                )
                return
            api_key = self.args.api_key
            if api_key and not (
                path.startswith("/health") or path.startswith("/metrics") or path == "/ready"
            ):
                auth = req.headers.get("authorization", "")
                if auth != "Bearer " + api_key:
                    status = 401
                    conn.respond(req, 401, b'{"error":"Unauthorized"}')
                    return
            status = handler(conn, req) or 200
        except HttpError as e:
            status = e.status
            conn.respond(req, e.status, e.body, e.content_type)
        except Exception as e:  # an emulator bug must not look like a hang
            log.exception("handler %s failed", path)
            status = 500
            conn.respond(
                req,
                500,
                P.dumps(
                    {
                        "object": "error",
                        "message": f"Internal server error: {e}",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                ),
            )
        finally:
            if self.metrics is not None and path != "/metrics":
                self.metrics.http(path, req.method, status)

    # ------------------------------------------------------------------ simple endpoints

    def h_health(self, conn, req):
        if not self.ready or self.draining:
            conn.respond(req, 503, b"", None)
            return 503
        conn.respond(req, 200, b"", None)

    def h_ready(self, conn, req):
        return self.h_health(conn, req)

    def h_ping(self, conn, req):
        conn.respond(req, 200, b"pong", TEXT)

    def h_model_info(self, conn, req):
        a = self.args
        arch = self.resolved.arch
        info = {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": a.weight_version,
        }
        if self.version >= (0, 5, 10):
            info = {
                "model_path": a.model_path,
                "served_model_name": self.served_model_name,
                "tokenizer_path": a.tokenizer_path or a.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": a.weight_version,
                "load_format": a.load_format,
                "reasoning_parser": a.reasoning_parser,
                "tool_call_parser": a.tool_call_parser,
                "disaggregation_mode": "null",
            }
        info.update(
            has_image_understanding=False,
            has_audio_understanding=False,
            model_type=arch.model_type,
            architectures=list(arch.architectures),
        )
        conn.respond(req, 200, P.dumps(info))

    def server_info(self) -> dict:
        r = self.resolved
        args = {
            k: v for k, v in vars(self.args).items() if not k.startswith("sim_") and k != "launch_command"
        }
        args.update(r.args)
        args["served_model_name"] = self.served_model_name
        if args.get("api_key"):
            args["api_key"] = "<redacted>"  # SGLang shows it; the emulator does not repeat secrets
        if r.spec_algorithm:
            args["speculative_algorithm"] = r.spec_algorithm
        st = self.engine.stats()
        internal = dict(args)
        internal.update(
            world_size=r.tp_size,
            effective_max_running_requests_per_dp=r.effective_max_running_requests,
            last_gen_throughput=st.gen_throughput,
            memory_usage=r.memory_usage,
        )
        if r.spec_algorithm and st.spec_accept_length:
            internal["avg_spec_accept_length"] = st.spec_accept_length
        out = dict(args)
        out.update(
            launch_command=self.args.launch_command,
            status="ready" if self.ready else "starting",
            max_total_num_tokens=r.max_total_num_tokens,
            max_req_input_len=r.max_req_input_len,
            startup_time=self.start_wall,
            hicache_object_layout=None,
            kv_events=None,
            internal_states=[internal] * max(1, r.dp_size),
            version=self.args.sim_sglang_version,
            frontend="python",
        )
        return out

    def h_server_info(self, conn, req):
        conn.respond(req, 200, json.dumps(self.server_info(), separators=(",", ":"), default=str).encode())

    def _model_card(self) -> dict:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.args.model_path,
            "parent": None,
            "max_model_len": self.resolved.context_len,
        }

    def h_models(self, conn, req):
        conn.respond(req, 200, P.dumps({"object": "list", "data": [self._model_card()]}))

    def h_model(self, conn, req):
        mid = req.path[len("/v1/models/") :]
        from urllib.parse import unquote

        mid = unquote(mid)
        if mid != self.served_model_name:
            conn.respond(req, 404, P.model_not_found_body(mid))
            return 404
        conn.respond(req, 200, P.dumps(self._model_card()))

    def h_flush(self, conn, req):
        body = (
            b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            b"requests, the operation will not be performed.)\n"
        )
        ok = self.engine.flush_cache()
        conn.respond(req, 200 if ok else 400, body, TEXT)
        return 200 if ok else 400

    def h_abort(self, conn, req):
        body = self._json(req, need_ctype=False)
        if body.get("abort_all"):
            for rid in list(self.active_rids):
                self.engine.abort(rid)
        elif body.get("rid"):
            self.engine.abort(str(body["rid"]))
        conn.respond(req, 200, b"", None)

    def h_metrics(self, conn, req):
        if self.metrics is None:
            conn.respond(req, 404, b'{"detail":"Not Found"}')
            return 404
        conn.respond(req, 200, self.metrics.render(), PROM)

    def h_loads(self, conn, req):
        st = self.engine.stats()
        r = self.resolved
        load = {
            "dp_rank": 0,
            "num_running_reqs": st.num_running_reqs,
            "num_waiting_reqs": st.num_queue_reqs,
            "num_used_tokens": st.num_used_tokens,
            "max_total_num_tokens": r.max_total_num_tokens,
            "token_usage": st.token_usage,
            "gen_throughput": st.gen_throughput,
            "cache_hit_rate": st.cache_hit_rate,
        }
        conn.respond(
            req,
            200,
            P.dumps({"timestamp": time.time(), "version": self.args.sim_sglang_version, "loads": [load]}),
        )

    # ------------------------------------------------------------------ generation

    def _json(self, req: Request, need_ctype: bool = True) -> dict:
        if need_ctype:
            ct = req.headers.get("content-type", "").lower().split(";", 1)[0].strip()
            if ct != "application/json":
                errs = [
                    {
                        "loc": ["header", "content-type"],
                        "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                        "type": "value_error",
                    }
                ]
                raise HttpError(400, P.validation_error_body(errs))
        if not req.body:
            if need_ctype:
                raise HttpError(
                    400,
                    P.validation_error_body(
                        [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
                    ),
                )
            return {}
        try:
            obj = json.loads(req.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            pos = getattr(e, "pos", 0)
            msg = getattr(e, "msg", str(e))
            raise HttpError(
                400,
                P.validation_error_body(
                    [
                        {
                            "type": "json_invalid",
                            "loc": ("body", pos),
                            "msg": "JSON decode error",
                            "input": {},
                            "ctx": {"error": msg},
                        }
                    ]
                ),
            ) from None
        if not isinstance(obj, dict):
            raise HttpError(
                400,
                P.validation_error_body(
                    [
                        {
                            "type": "model_attributes_type",
                            "loc": ("body",),
                            "msg": "Input should be a valid dictionary or object to extract fields from",
                            "input": obj,
                        }
                    ]
                ),
            )
        return obj

    def _not_ready(self):
        if self.tokenizer is None:
            raise HttpError(503, P.error_body("The server is not ready yet (loading).", 503))

    @staticmethod
    def _field_error(field: str, msg: str, kind: str = "value_error", value=None):
        return HttpError(
            400, P.validation_error_body([{"type": kind, "loc": ("body", field), "msg": msg, "input": value}])
        )

    def h_chat(self, conn, req):
        body = self._json(req)
        self._not_ready()
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise self._field_error(
                "messages",
                "Field required" if msgs is None else "Input should be a non-empty list",
                "missing" if msgs is None else "list_type",
                msgs,
            )
        from servesweep.tokenizer import render_chatml

        ctk = body.get("chat_template_kwargs") or {}
        try:
            text = render_chatml(msgs, enable_thinking=ctk.get("enable_thinking", True) is not False)
        except (
            Exception
        ) as e:  # a malformed message list is a templating ValueError in SGLang: 400 BadRequest
            raise HttpError(
                400, P.error_body(f"Failed to apply chat template: {e}", 400, "BadRequest")
            ) from None
        max_new = body.get("max_completion_tokens")
        if max_new is None:
            max_new = body.get("max_tokens")
        return self._start(conn, req, body, "chat", text, None, max_new)

    def h_completion(self, conn, req):
        body = self._json(req)
        self._not_ready()
        prompt = body.get("prompt")
        if prompt is None:
            raise self._field_error("prompt", "Field required", "missing")
        ids = None
        if isinstance(prompt, list):
            if prompt and all(isinstance(x, int) for x in prompt):
                ids, prompt = prompt, None
            elif len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            else:
                raise HttpError(
                    400, P.error_body("The emulator serves one prompt per request (no batches).", 400)
                )
        elif not isinstance(prompt, str):
            raise self._field_error("prompt", "Input should be a valid string", "string_type", prompt)
        max_new = body.get("max_tokens", 16)
        if max_new is not None and (not isinstance(max_new, int) or max_new <= 0):
            raise self._field_error(
                "max_tokens", "Value error, max_tokens must be positive", "value_error", max_new
            )
        return self._start(conn, req, body, "completion", prompt, ids, max_new)

    def h_generate(self, conn, req):
        body = self._json(req, need_ctype=False)
        self._not_ready()
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise HttpError(
                400, P.dumps({"error": {"message": "Either text or input_ids should be provided."}})
            )
        if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            raise HttpError(
                400,
                P.dumps({"error": {"message": "The emulator serves one prompt per request (no batches)."}}),
            )
        sp = body.get("sampling_params") or {}
        merged = {
            "stream": body.get("stream", False),
            "ignore_eos": sp.get("ignore_eos", False),
            "rid": body.get("rid"),
            "extra_key": body.get("extra_key"),
            "cache_salt": body.get("cache_salt"),
        }
        return self._start(conn, req, merged, "generate", text, ids, sp.get("max_new_tokens", 128))

    def _start(self, conn, req, body, kind, text, ids, max_new):
        """Tokenize, validate against the context length, then submit (maybe after a slow-first-byte fault)."""
        try:
            fault = self.faults.pick(req.headers.get("x-sim-fault"))
        except ValueError as e:
            raise HttpError(400, P.error_body(str(e), 400)) from None
        if fault is not None and fault.kind in PRE_STREAM:
            status = int(fault.kind)
            msg = f"{PRE_STREAM[fault.kind]} (injected fault)"
            self._record_fault(req, body, status, fault)
            conn.respond(req, status, P.error_body(msg, status))
            return status
        if ids is None:
            if len(text) > 16384:  # long prompts tokenize off the event loop (tiktoken releases the GIL)
                fut = self.loop.run_in_executor(None, self.tokenizer.encode, text)
                fut.add_done_callback(
                    lambda f: self._after_tokenize(conn, req, body, kind, f, max_new, fault)
                )
                return 200
            ids = self.tokenizer.encode(text)
        return self._validated(conn, req, body, kind, ids, max_new, fault)

    def _after_tokenize(self, conn, req, body, kind, fut, max_new, fault):
        try:
            ids = fut.result()
            self._validated(conn, req, body, kind, ids, max_new, fault)
        except HttpError as e:
            conn.respond(req, e.status, e.body, e.content_type)

    def _validated(self, conn, req, body, kind, ids, max_new, fault):
        r = self.resolved
        ctx = r.context_len
        n = len(ids) + r.num_reserved_tokens
        stream = bool(body.get("stream", False))
        if n >= ctx:
            if self.args.allow_auto_truncate:
                ids = ids[: max(1, ctx - 1 - r.num_reserved_tokens)]
                n = len(ids) + r.num_reserved_tokens
            else:
                return self._reject(conn, req, kind, P.context_too_long(n, ctx))
        if max_new is not None:
            if not isinstance(max_new, int) or max_new < 0:
                raise self._field_error("max_tokens", "Input should be a valid integer", "int_type", max_new)
            if n + max_new > ctx:
                if self.args.allow_auto_truncate:
                    max_new = max(0, ctx - n)
                else:
                    return self._reject(conn, req, kind, P.context_exceeded(n, max_new, ctx))
        else:
            max_new = max(1, ctx - n - 1)
        if fault is not None and fault.kind == "slow_first_byte":
            self.loop.call_later(fault.arg, self._submit, conn, req, body, kind, ids, max_new, fault, stream)
            return 200
        return self._submit(conn, req, body, kind, ids, max_new, fault, stream)

    def _reject(self, conn, req, kind, msg):
        if kind == "generate":
            # native /generate: 400 {"error":{"message":..}} (non-stream); stream: 200 + error event
            if self._stream_of(req):
                payload = P.dumps(
                    {
                        "error": {
                            "message": msg,
                            "type": "invalid_request_error",
                            "code": 400,
                            "retryable": False,
                        }
                    }
                )
                data = b"data: " + payload + b"\n\n" + P.DONE
                conn.transport.write(
                    head(200, SSE, None) + b"%x\r\n%s\r\n%s" % (len(data), data, CHUNKED_END)
                )
                conn.done(req)
                return 200
            conn.respond(req, 400, P.dumps({"error": {"message": msg}}))
            return 400
        conn.respond(req, 400, P.error_body(msg, 400))
        return 400

    @staticmethod
    def _stream_of(req) -> bool:
        try:
            return bool(json.loads(req.body).get("stream"))
        except Exception:
            return False

    @property
    def active_rids(self):
        return self._active.keys()

    def _submit(self, conn, req, body, kind, ids, max_new, fault, stream):
        if conn.closed:
            return 499
        rid = body.get("rid") or P.new_id()
        if not isinstance(rid, str):
            rid = str(rid)
        model = body.get("model", "default") if kind != "generate" else self.served_model_name
        g = Gen(self, conn, req, kind, stream, str(model), len(ids), max_new, fault, rid, body)
        ns = body.get("cache_salt") or body.get("extra_key")
        ereq = self.engine_mod.EngineRequest(
            rid=rid,
            prompt_ids=ids,
            max_new_tokens=max_new,
            emit=g.on_tokens,
            ignore_eos=bool(body.get("ignore_eos", False)),
            cache_namespace=str(ns) if ns else None,
        )
        g.ereq = ereq
        if stream:
            conn.transport.write(head(200, SSE, None))
            g.headers_ns = time.monotonic_ns()
        conn.active = g
        self._active[rid] = g
        try:
            self.engine.submit(ereq)
        except ValueError as e:  # a duplicate client-supplied rid
            conn.active = None
            self._active.pop(rid, None)
            if stream:
                g.done = True
                g._write_end(P.stream_error_event(str(e), 400) + P.DONE)
                conn.done(req)
                return 200
            conn.respond(req, 400, P.error_body(str(e), 400))
            return 400
        except self.engine_mod.QueueFull:
            ereq.finish_reason = "abort"
            ereq.abort_status = 503
            ereq.abort_message = P.QUEUE_FULL
            g._finish()
        return 200

    def _record_fault(self, req, body, status, fault):
        if self.gt is not None:
            now = time.monotonic_ns()
            self.gt.add(
                {
                    "id": req.headers.get("x-request-id"),
                    "response_id": None,
                    "endpoint": req.path,
                    "stream": bool(body.get("stream", False)),
                    "recv_ns": req.recv_ns,
                    "headers_ns": now,
                    "chunks": [],
                    "end_ns": now,
                    "status": status,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "cached_tokens": 0,
                    "finish_reason": None,
                    "fault": str(fault),
                }
            )


# ====================================================================== entry point


def run_server(args) -> int:
    """Resolve the server like SGLang, print its start-up lines, serve until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )
    from servesweep import hardware

    from . import engine as engine_mod

    resolve_args = {k: v for k, v in vars(args).items() if k != "launch_command"}
    try:
        resolved = hardware.resolve_server(resolve_args, os.environ)
    except ValueError as e:
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        app = SimApp(args, resolved, engine_mod)
    except ValueError as e:  # e.g. an unknown --sim-calibration key or profile
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    app.loop = loop
    for line in resolved.log_lines:
        log.info(line)

    server = loop.run_until_complete(
        loop.create_server(
            lambda: Connection(app), host=args.host, port=args.port, reuse_address=True, backlog=4096
        )
    )
    port = server.sockets[0].getsockname()[1]
    log.info(f"Uvicorn running on http://{args.host}:{port} (Press CTRL+C to quit)")
    app.engine.start(loop)
    eng = app.engine
    if hasattr(eng, "_t0") and hasattr(eng, "_vt"):
        # during an emit callback the engine's step deadline is _t0 + _vt (time.monotonic seconds)
        app._sched_attr = lambda: eng._t0 + eng._vt

    stop = loop.create_future()

    def _signal(*_):
        if not stop.done():
            stop.set_result(True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _signal)

    async def startup():
        t0 = time.monotonic()
        await loop.run_in_executor(None, app.load)
        rest = args.sim_load_time - (time.monotonic() - t0)
        if rest > 0:
            await asyncio.sleep(rest)
        app.ready = True
        log.info("The server is fired up and ready to roll!")

    async def flusher():
        while True:
            await asyncio.sleep(1.0)
            if app.gt is not None:
                app.gt.flush()

    async def main():
        st = loop.create_task(startup())
        fl = loop.create_task(flusher())
        await stop
        app.draining = True
        st.cancel()
        fl.cancel()
        server.close()
        await app.engine.stop()

    try:
        loop.run_until_complete(main())
    finally:
        if app.gt is not None:
            app.gt.close()
    return 0
