"""`n > 1` on /v1/chat/completions and /v1/completions, as SGLang serves it (0.5.11 and 0.5.23 alike).

SGLang's tokenizer manager (`managers/tokenizer_manager.py::_handle_batch_request`, parallel sampling) first sends
the prompt once with `max_new_tokens=0`, so that its prefix is in the radix cache, and waits for it; then it sends n
sub-requests, each under a fresh `uuid4().hex` id, and streams their outputs as they come, each tagged with its
choice's index. The OpenAI layer (`entrypoints/openai/serving_chat.py::_generate_chat_stream`,
`serving_completions.py::_generate_completion_stream`) then writes:
- chat: each choice's chunks under its own id; a role chunk for an index the first time that index has output; the
  finish chunks of every index only once every choice has ended, in the order they ended, all under the id of the
  stream's last output; then the usage chunk under that id;
- completions: each choice's chunks under its own id, its finish reason on its last chunk; the usage chunk under
  the id of the stream's last output;
- a body (no stream): the choices in index order under the first choice's id.
Usage (`usage_processor.py`): prompt and cached tokens counted once (the first choice's), completion and reasoning
tokens summed over the choices.

Each choice is one `stream.GenerationStream` of the group (the engine runs them as separate requests); the group
owns the HTTP response and ends it. Mid-stream faults (`X-Sim-Fault`) apply to n = 1 requests only.
"""

from __future__ import annotations

import json
import time
from time import monotonic_ns

from . import protocol as P
from .connection import CHUNKED_END, JSON, SSE, head


def choice_count(body: dict) -> int:
    """The request's `n` (SGLang's request models: `n: int = 1`)."""
    n = body.get("n", 1)
    return n if type(n) is int else 1


def start_choices(app, conn, req, body, kind, ids, max_new, stream) -> int:
    """The prefix-caching request first; the n choices once it has finished (`ChoiceGroup.on_prefix`)."""
    group = ChoiceGroup(app, conn, req, body, kind, ids, max_new, stream)
    ns = body.get("cache_salt") or body.get("extra_key")
    prefix = app.engine_mod.EngineRequest(
        rid=P.new_id(),
        prompt_ids=ids,
        max_new_tokens=0,
        emit=group.on_prefix,
        ignore_eos=True,
        cache_namespace=str(ns) if ns else None,
    )
    group.prefix = prefix
    conn.active = group
    app._active[prefix.rid] = group  # a draining server waits for it; abort_all reaches it
    try:
        app.engine.submit(prefix)
    except app.engine_mod.QueueFull:
        app._active.pop(prefix.rid, None)
        group.fail(503, P.QUEUE_FULL)
    return 200


class ChoiceGroup:
    """The choices of one request: one HTTP response, ended when the last choice has ended."""

    def __init__(self, app, conn, req, body, kind, ids, max_new, stream):
        self.app, self.conn, self.req, self.body, self.kind = app, conn, req, body, kind
        self.ids, self.max_new, self.stream = ids, max_new, stream
        self.n = choice_count(body)
        self.created = int(time.time())  # one `created` for every chunk of the response
        self.members: list = []  # GenerationStream per choice, in index order
        self.ended_order: list = []  # the choices in the order they ended
        self.prefix = None
        self.ended = False
        self.headers_ns = 0

    # ------------------------------------------------------------------ start

    def on_prefix(self, ereq, n: int, finished: bool) -> None:
        """The engine's callback of the prefix-caching request: when it ends, the choices start."""
        if not finished:
            return
        self.app._active.pop(ereq.rid, None)
        if self.conn.closed or self.ended:
            return
        if ereq.finish_reason == "abort":  # /abort_request, a queue or input-length abort: no choice starts
            self.fail(ereq.abort_status or 503, ereq.abort_message or "Aborted")
            return
        if self.stream:
            self.conn.transport.write(head(200, SSE, None))
        self.headers_ns = monotonic_ns()
        for i in range(self.n):
            if self.conn.closed or self.ended:
                break
            sub = {**self.body, "rid": P.new_id()}  # SGLang gives each sub-request a fresh id
            self.app._submit(
                self.conn, self.req, sub, self.kind, self.ids, self.max_new, None, self.stream, group=self, index=i
            )

    def fail(self, status: int, message: str) -> None:
        """The request failed before any choice started: SGLang's error answer, stream or not."""
        self.ended = True
        conn = self.conn
        if conn.closed:
            return
        if self.stream:
            data = P.stream_error_event(message, status) + P.DONE
            conn.transport.write(head(200, SSE, None) + b"%x\r\n%s\r\n%s" % (len(data), data, CHUNKED_END))
        else:
            body = P.error_body(message, status)
            conn.transport.write(head(status, JSON, len(body)) + body)
        conn.done(self.req)

    # ------------------------------------------------------------------ ends

    def member_done(self, g) -> None:
        """A choice has ended (GenerationStream._finish): its last bytes, then the response's end after the last."""
        e = g.ereq
        status = 200
        if self.ended:  # the response is over (an error, or the client left): only the books
            g._record(499 if self.conn.closed else 200)
            return
        aborted = e is not None and e.finish_reason == "abort" and e.abort_status
        if aborted:
            status = e.abort_status
        elif self.stream:
            self._choice_end(g)
        self.ended_order.append(g)
        if aborted:
            self._end_with_error(g, e.abort_status, e.abort_message or "Aborted")
        elif len(self.ended_order) == self.n:
            self.ended = True
            if self.stream:
                self._write_end(self._stream_tail(g))
            else:
                self._respond(200, self._body())
        g._record(status)

    def _choice_end(self, g) -> None:
        """What a choice's own end writes: a role chunk (chat) or a finish chunk (completions) when its output had
        none, as SGLang answers a choice whose last output comes with no text."""
        e = g.ereq
        if g.kind == "chat" and g.chunks_written == 0:
            self._write(g.fmt.role_event)
        elif g.kind == "completion" and (e.finish_reason == "abort" or g.chunks_written == 0):
            self._write(g.fmt.last(b"", e.finish_reason or "abort", None))

    def _stream_tail(self, last, finished=None) -> bytes:
        """Finish chunks (chat), usage chunk, [DONE]: all under the id of the stream's last output."""
        out = []
        if self.kind == "chat":
            for g in self.ended_order if finished is None else finished:
                e = g.ereq
                fmt = P.ChatChunks(last.rid, self.created, last.model, last.legacy, g.index)
                out.append(fmt.finish(e.finish_reason or "abort", g._matched(e)))
        if last.include_usage:
            out.append(last.fmt.usage(self.usage()))
        out.append(P.DONE)
        return b"".join(out)

    def _end_with_error(self, g, status: int, message: str) -> None:
        """A choice aborted with a status: SGLang writes the error event and stops reading; the choices that had
        ended get their finish chunks, then usage and [DONE]. The other choices are aborted."""
        self.ended = True
        if self.stream:
            done = [m for m in self.ended_order if m is not g]
            self._write_end(P.stream_error_event(message, status) + self._stream_tail(g, done))
        else:
            self._respond(status, P.error_body(message, status))
        for m in self.members:
            if not m.done:
                self.app.engine.abort(m.rid)

    def usage(self) -> dict:
        """SGLang's usage over the choices: prompt and cached tokens once, completion and reasoning summed."""
        first = self.members[0]
        comp = sum(m.ereq.completion_tokens for m in self.members if m.ereq is not None)
        cached = first.ereq.cached_tokens if first.ereq is not None else 0
        return P.usage_dict(
            first.prompt_tokens,
            comp,
            cached,
            sum(m.reasoning for m in self.members),
            cache_report=first.cache_report,
            details=self.app.version >= P.USAGE_DETAILS_SINCE,
        )

    def _body(self) -> bytes:
        """The whole answer: every choice's own body merged, in index order, under the first choice's id."""
        choices = []
        for g in self.members:
            c = json.loads(g._final_body())["choices"][0]
            c["index"] = g.index
            choices.append(c)
        obj = json.loads(self.members[0]._final_body())
        obj["choices"] = choices
        obj["usage"] = self.usage()
        return P.dumps(obj)

    # ------------------------------------------------------------------ bytes

    def _write(self, payload: bytes) -> None:
        if not self.conn.closed:
            self.conn.transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def _write_end(self, payload: bytes) -> None:
        conn = self.conn
        if conn.closed:
            return
        conn.transport.write(b"%x\r\n%s\r\n%s" % (len(payload), payload, CHUNKED_END))
        conn.done(self.req)

    def _respond(self, status: int, body: bytes) -> None:
        conn = self.conn
        if conn.closed:
            return
        t = monotonic_ns()
        for g in self.members:  # a whole body is one "chunk" holding each choice's tokens (ground truth)
            g.headers_ns = t
            if g.chunks is not None and g.ereq is not None:
                g.chunks.extend((t, g.ereq.completion_tokens))
        conn.transport.write(head(status, JSON, len(body)) + body)
        conn.done(self.req)

    def client_gone(self) -> None:
        """The client left: the prefix request and every choice are aborted, as SGLang does on disconnect."""
        self.ended = True
        if self.prefix is not None and not self.members:
            self.app.engine.abort(self.prefix.rid)
        for g in list(self.members):
            g.client_gone()
