"""One generation request on the wire: the engine's callbacks turned into SSE chunks or a final body.

`GenerationStream.on_tokens(req, n, finished)` is the engine's `emit` callback, called at each step's end time. A plain
token chunk of a chat/completions stream takes a short path: the chunk's bytes are a per-request prefix, the words,
and a per-request suffix, written with one `os.write` on the socket while the transport has nothing buffered (else,
and for whatever a short write leaves, through `transport.write`, which keeps the order); nothing is JSON-encoded or
logged per chunk, and the ground truth gets the write time and the step's scheduled time (one int shared by the
step). Role, finish, usage and `[DONE]` events, reasoning splits, continuous usage, faults and native `/generate`
events take the general path. When a request ends, its metrics are observed and its ground-truth line is queued.
"""

from __future__ import annotations

import time
import zlib
from os import write as os_write
from time import monotonic_ns
from typing import TYPE_CHECKING, Any

from . import protocol as P
from .connection import CHUNKED_END, HEX, JSON, head

if TYPE_CHECKING:
    from .engine import EngineRequest

NON_STREAM_FAULTS = ("disconnect", "error_event", "stall", "malformed")


class GenerationStream:
    """One generation request: its engine request, its bytes, its fault and its ground-truth record."""

    __slots__ = (
        "app", "conn", "req", "ereq", "rid", "gt_id", "kind", "stream", "model", "created", "fmt", "wt", "word",
        "pending", "interval", "reasoning_left", "reasoning", "prompt_tokens", "include_usage", "continuous",
        "cache_report", "chunks", "sched", "chunks_written", "fault", "stall_until", "held_finish", "done",
        "headers_ns", "text_parts", "output_ids", "legacy", "t_recv", "max_new", "client_gone_flag",
        "endpoint", "final_written", "eng", "fast", "hp", "mt", "base_len", "group", "index", "tr", "fd",
    )  # fmt: skip

    def __init__(
        self,
        app,
        conn,
        req,
        kind,
        stream,
        model,
        prompt_tokens,
        max_new,
        fault,
        rid,
        body,
        choice=0,
        created=None,
    ):
        # One long constructor on purpose: it sets every slot the per-chunk path reads (precomputed bytes, formats,
        # fault state) once per request, so emitting a chunk only slices and writes (docs/emulator.md).
        self.app = app
        self.conn = conn
        self.req = req
        self.kind = kind  # "chat" | "completion" | "generate"
        self.endpoint = req.path
        self.stream = stream
        self.model = model
        # every choice of an n > 1 request has the request's one `created`
        self.created = int(time.time()) if created is None else created
        self.rid = rid
        self.gt_id = req.headers.get("x-request-id") or rid
        self.wt = app.words
        self.word = zlib.crc32(rid.encode()) % self.wt.n  # stable across runs, unlike hash()
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
        # what was written when, flat: [write_ns, tokens, write_ns, tokens, ...]. Plain ints, no tuple per chunk:
        # 150k chunks of live tuples would make the cyclic GC scan them, a pause in the middle of a step's writes.
        self.chunks: list[int] | None = [] if app.record_chunks else None
        # the engine's scheduled emission times, when it exposes its clock (see server.run_server)
        self.sched: list | None = [] if app.gt is not None else None
        self.chunks_written = 0
        self.fault = fault
        self.stall_until = 0.0
        self.held_finish = False
        self.done = False
        self.headers_ns = 0
        # str pieces; (reasoning, content) pairs for a non-stream chat
        self.text_parts: list[Any] | None = [] if (kind == "generate" or not stream) else None
        self.output_ids: list[int] | None = [] if kind == "generate" else None
        self.t_recv = req.recv_ns
        self.client_gone_flag = False
        self.ereq: EngineRequest | None = None  # set by the server before the engine has the request
        self.final_written = False
        # the batched /generate (server.BatchGroup) or n > 1 request (choices.ChoiceGroup) it belongs to, its index
        self.group: Any = None  # server.BatchGroup | choices.ChoiceGroup (both import this module)
        self.index = None
        # the chunk formatter, duck-typed: protocol.ChatChunks, protocol.CompletionChunks, logprobs' wrapper of
        # either, or None (/generate)
        self.fmt: Any
        if kind == "chat":
            self.fmt = P.ChatChunks(rid, self.created, model, self.legacy, choice)
        elif kind == "completion":
            self.fmt = P.CompletionChunks(rid, self.created, model, choice)
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
                self.hp = f.head + f.text_pre
                self.mt = f.tail + b',"usage":null}\n\n\r\n'
            self.base_len = len(self.hp) + len(self.mt) - 2
            self.tr = conn.transport
            sock = self.tr.get_extra_info("socket")
            self.fd = sock.fileno() if sock is not None else -1
            if self.fd < 0:
                self.fast = False

    # ------------------------------------------------------------------ engine callback (hot path)

    def on_tokens(self, ereq, n: int, finished: bool) -> None:
        if self.fast and n and not finished and self.chunks_written:
            wt = self.wt
            if n <= wt.n:
                w = self.word
                e = w + n
                offs = wt.offsets
                text = wt.blob[offs[w] : offs[e]]
                self.word = e if e < wt.n else e - wt.n
                size = self.base_len + len(text)
                data = (HEX[size] if size < 16384 else b"%x\r\n" % size) + self.hp + text + self.mt
                ch = self.chunks
                if ch is not None:  # the write time is taken just before the write
                    ch.append(monotonic_ns())
                    ch.append(n)
                    sc = self.sched
                    if sc is not None:
                        sc.append(self.eng.sched_ns)
                tr = self.tr
                # The socket directly (uvloop's write costs ~0.5 µs more per call) unless the transport holds
                # unsent bytes (order) or is closing (its fd may be closed, even reused).
                if tr.get_write_buffer_size() or tr.is_closing():
                    tr.write(data)
                else:
                    try:
                        k = os_write(self.fd, data)
                    except OSError:  # EAGAIN, EPIPE: the transport buffers it, or reports the error itself
                        k = 0
                    if k != len(data):
                        tr.write(data[k:] if k else data)
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
            if self.kind == "chat":  # non-stream chat keeps reasoning apart
                self.text_parts.append((rb.decode(), cb.decode()))
            else:
                self.text_parts.append((rb + cb).decode())
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
        r = min(
            n, self.reasoning_left
        )  # reasoning tokens in this chunk (a chat chunk may split in two events)
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
            # serving_completions.py's per-chunk usage passes no cached tokens (0.5.11 and 0.5.23): its
            # prompt_tokens_details is null even with --enable-cache-report (chat's carries them)
            usage = b',"usage":' + P.dumps(self._usage(completion, cached=False)) if self.continuous else b""
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
            t = monotonic_ns()
            split = kind == "chat" and 0 < r < n  # reasoning and content events: one ground-truth chunk each
            self.chunks.extend((t, r, t, n - r) if split else (t, n))
            if self.sched is not None:
                sc = self.eng.sched_ns
                self.sched.extend((sc, sc) if split else (sc,))
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

    def _usage(self, completion: int, cached: bool = True) -> dict:
        tokens = self.ereq.cached_tokens if self.ereq is not None else 0
        return P.usage_dict(
            self.prompt_tokens,
            completion,
            tokens,
            self.reasoning,
            cache_report=self.cache_report and cached,
            details=self.app.version >= P.USAGE_DETAILS_SINCE,
        )

    def _meta(self, finished: bool) -> dict:
        e = self.ereq
        comp = e.completion_tokens if e is not None else 0
        m = {
            "id": self.rid,
            "finish_reason": None,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            ("num_retractions" if self.app.version >= (0, 5, 12) else "total_retractions"): e.num_retractions
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

    def _generate_obj(self, finished: bool) -> dict:
        assert self.text_parts is not None  # /generate keeps its text
        obj = {
            "text": "".join(self.text_parts),
            "output_ids": self.output_ids,
            "meta_info": self._meta(finished),
        }
        if self.index is not None and self.stream:  # batched streams tag each event; a batch body is a list
            obj["index"] = self.index
        return obj

    def _generate_event(self, finished: bool) -> bytes:
        return b"data: " + P.dumps(self._generate_obj(finished)) + b"\n\n"

    # ------------------------------------------------------------------ endings

    def _finish(self):
        """The engine finished this request (length, stop, abort, or scheduler-side error)."""
        self.done = True
        self.fast = False
        e = self.ereq
        conn = self.conn
        status = 200
        if self.group is not None:
            if self.kind != "generate":  # one choice of an n > 1 request: its group ends the response
                self.group.member_done(self)
                return
            self._finish_in_group(e)
            return
        assert e is not None  # a stream outside a group is finished only through its engine request
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

    def _finish_in_group(self, e):
        """A member of a batched /generate: its last event (or body) goes out; the group ends the response."""
        conn = self.conn
        status = 200
        if e is not None and e.finish_reason == "abort" and e.abort_status:
            status = e.abort_status
            if self.stream:
                self._write_data(P.stream_error_event(e.abort_message or "Aborted", status))
            body = {"error": {"message": e.abort_message or "Aborted"}}
        elif self.stream:
            if not self.final_written:
                self._write_data(self._generate_event(finished=True))
            body = None
        else:
            body = self._generate_obj(True)
        if self.chunks is not None and not self.stream and not conn.closed:
            self.chunks.extend((monotonic_ns(), e.completion_tokens if e is not None else 0))
        self._record(status)
        self.group.member_done(self, body)

    def _write_data(self, payload: bytes):
        if not self.conn.closed:
            self.conn.transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))

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
        assert e is not None and self.text_parts is not None  # a finished non-stream request
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
                tool_calls=self.app.version < P.MESSAGE_TOOL_CALLS_UNTIL,
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
        t = monotonic_ns()
        self.headers_ns = t
        if self.chunks is not None:  # a whole body is one "chunk" holding every token
            self.chunks.extend((t, self.ereq.completion_tokens if self.ereq else 0))
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
        """Metrics and the ground-truth line of a finished request, after the current engine step's writes.

        Serializing a line costs ~50 µs (a few hundred chunk pairs); when a step finishes many requests, doing it
        inline would hold back the step's remaining chunk writes. `call_soon` runs it once the step's callback
        returns; the request stays in `_active` until then, so a draining shutdown waits for its line.
        """
        end = time.monotonic_ns()
        loop = self.app.loop
        if loop is None:
            self._record_now(status, end)
        else:
            loop.call_soon(self._record_now, status, end)

    def _record_now(self, status: int, end: int):
        app = self.app
        app._active.pop(self.rid, None)
        e = self.ereq
        comp = e.completion_tokens if e is not None else 0
        cached = e.cached_tokens if e is not None else 0
        reason = "abort" if self.client_gone_flag else (e.finish_reason if e is not None else None)
        if app.metrics is not None and e is not None:
            itl = []
            ch = self.chunks
            if ch:
                for i in range(2, len(ch), 2):
                    if ch[i + 1]:
                        itl.append(((ch[i] - ch[i - 2]) / 1e9, ch[i + 1]))
            ttft = (ch[0] - self.t_recv) / 1e9 if ch else None
            qt = e.queue_time  # first forward entry minus queue entry, SGLang's one observation per request
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
                "chunks": [[w, n] for w, n in zip(self.chunks[::2], self.chunks[1::2], strict=True)]
                if self.chunks is not None
                else None,
                "end_ns": end,
                "status": status,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": comp,
                "cached_tokens": cached,
                "finish_reason": reason,
                "fault": str(self.fault) if self.fault is not None else None,
            }
            if self.sched:
                rec["sched_ns"] = self.sched
            app.gt.add(rec)
