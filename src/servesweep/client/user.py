"""The streaming Locust user: one closed-loop user that POSTs pre-encoded bodies and timestamps every SSE line.

The per-chunk path does one pass per socket read: the read itself, stamped with the time its bytes reached this host
(the kernel's receive stamp on Linux, moved onto the monotonic clock; a user-space `time.monotonic_ns()` after the
read where there is none: client/rxstamp.py), then the HTTP parser, and the complete lines are cut with that stamp;
the lines are parsed after the stream ended. Every failure is classified (records.ERROR_CLASSES), counted, and never
kills the user. The shared state of one point (prompt bodies, counters, record buffer) is a `LoadContext`, the
`load` of the process's `state.ClientState` (environment.servesweep, made at Locust's init: client/plugin.py).
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import gevent
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from geventhttpclient.url import URL
from locust import task
from locust.contrib.fasthttp import FastHttpUser

from servesweep.client.locust_internals import (
    connection_pool,
    response_body_buffer,
    response_socket,
    set_idle_socket_check,
)
from servesweep.client.messages import RECORD_CONTEXT_KEY
from servesweep.client.rxstamp import RxClock, idle_socket_alive, stamp_socket
from servesweep.client.sse import (
    classify_status,
    cut_lines,
    error_message,
    is_token_line,
    parse_stream,
    short,
)
from servesweep.config.point import LoadPoint
from servesweep.results.records import RecordBuffer
from servesweep.workload.arrivals import Arrivals

if TYPE_CHECKING:
    from servesweep.workload.arrivals import TraceSchedule, TraceStart
    from servesweep.workload.build import AgentSpec, TraceSpec


# A trace start handed out this long after its slot waited for a free user (the concurrency cap bound); less is the
# hub's own latency between a user's request and its next start.
CAP_BOUND_LATE_NS = 5_000_000


class LLMFailure(Exception):
    """What Locust's failure table shows: the error class only (a bounded set, so its error dict stays small)."""


class _TotalTimeout(Exception):
    pass


@dataclass
class LoadContext:
    """Everything the users of one point share inside one Locust process."""

    point: LoadPoint
    bodies: list[tuple[bytes, bytes]]  # per prompt: (head, tail); a request is head + nonce + tail
    nonce_digits: int  # 0: no nonce (cache busting off)
    headers: dict[str, str]
    path: str
    nonce_format: str = "digits"  # the pool's (prompts.nonce_scheme): "spaced" puts a space before each digit
    output_tokens: list[int] | None = None  # per body: its max_tokens (None: the point's output_tokens)
    agent: AgentSpec | None = None  # users run agent sessions instead of single requests
    trace: TraceSpec | None = None  # a trace replay: body i is the trace's request i (docs/workloads.md)
    trace_schedule: TraceSchedule | None = None  # its starts for this process (set at test start)
    sessions_started: int = 0
    buffer: RecordBuffer = field(default_factory=RecordBuffer)
    measure_start_ns: int = 0  # requests scheduled before this are warmup
    budget: int | None = None  # this process's share of `requests` (None: the point's whole budget)
    arrivals: Arrivals | None = None  # open loop: this process's slots (set at test start)
    end_ns: int = 0  # open loop, duration points: no slot at or after this
    on_budget_done: Callable[[], None] | None = None  # None: runner.quit (workers ship records first)
    closing: bool = False  # the master ended the point: send nothing more, let running streams finish
    prepared: bool = False  # it has its share, and the process its sampler and status file (client/share.py)
    in_flight: int = 0  # requests sent and not ended yet
    # SSE events read so far, counted per socket read while the streams run (warmup included): the parent's live
    # tok/s during long decodes, when no request has finished yet (driver/point_progress.py)
    streamed_events: int = 0
    issued: int = 0  # measured requests started (the budget of `requests`)
    completed: int = 0  # measured requests ended
    failed: int = 0  # of those, failed
    quit_requested: bool = False
    users_started: int = 0
    quit_delay_s: float = 0.0  # > 0 lets Locust's CSV writer (once a second) see the final numbers
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    mono_to_wall_ns: int = field(default_factory=lambda: time.time_ns() - time.monotonic_ns())
    _next_prompt: int = 0

    def __post_init__(self) -> None:
        from servesweep.workload.prompts import Nonces

        if not self.bodies:
            raise ValueError("LoadContext: the prompt pool is empty")
        self._next_prompt = random.randrange(len(self.bodies))  # workers start at different prompts
        # Digits least-significant first from a random start per process: consecutive requests differ from the
        # nonce's first token, and two workers rarely send the same nonce at once.
        self._nonces = Nonces(self.nonce_digits, spaced=self.nonce_format == "spaced")

    def next_body(self) -> bytes:
        return self.next_request()[0]

    def next_request(self) -> tuple[bytes, int]:
        """The next body (with a fresh nonce) and its output length."""
        i = self._next_prompt
        self._next_prompt = (i + 1) % len(self.bodies)
        head, tail = self.bodies[i]
        out = self.output_tokens[i] if self.output_tokens else self.point.output_tokens
        if not self.nonce_digits:
            return head + tail, out
        return b"".join((head, next(self._nonces), tail)), out  # one copy of a body that can be ~400 KB

    def next_nonce(self) -> str:
        return next(self._nonces).decode() if self.nonce_digits else ""

    def share(self) -> int | None:
        """The measured requests this process completes before it stops (None: no budget, a duration point)."""
        return self.budget if self.budget is not None else self.point.requests

    def claim(self) -> bool:
        """Take one measured request from the budget; False when the point has issued all it should."""
        n = self.share()
        if n is not None and self.issued >= n:
            return False
        self.issued += 1
        return True

    def next_slot(self) -> tuple[int, bool] | None:
        """When the next request is due and whether it is warmup; None when this process sends no more.
        Closed loop: now. Open loop: the next slot of the schedule, in the future or (when every stream of the cap
        was busy at its time) in the past: the request is sent late and keeps its slot as `scheduled_ns`, so the
        lag, and latency from the schedule, show what a closed loop would hide (coordinated omission)."""
        if self.closing:
            return None
        if self.arrivals is None:
            scheduled = time.monotonic_ns()
        else:
            scheduled = self.arrivals.next_ns()
            if self.end_ns and scheduled >= self.end_ns:
                return None
        warm = scheduled < self.measure_start_ns
        if not warm and not self.claim():
            return None
        return scheduled, warm


def _in_connect(exc: BaseException) -> bool:
    """True when the exception was raised while opening the TCP connection (not while waiting for bytes)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("_connect_socket", "_create_socket", "create_connection"):
            return True
        tb = tb.tb_next
    return False


class LLMUser(FastHttpUser):
    """Streams chat or completion requests in a closed loop (no wait time) and records each one."""

    # Per-socket-operation timeouts (geventhttpclient): the locustfile sets them from the point before users spawn.
    connection_timeout = 10.0
    network_timeout = 900.0
    max_retries = 0
    concurrency = 1  # one stream at a time per user
    host = "http://127.0.0.1"

    def on_start(self) -> None:
        # A worker process (--processes, --worker) can spawn users while its init listener is still building the
        # prompt bodies (the probes yield to the hub): wait for it, bounded.
        deadline = time.monotonic() + 600
        while (ctx := getattr(getattr(self.environment, "servesweep", None), "load", None)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("servesweep: no LoadContext after 600 s; see the init errors above")
            gevent.sleep(0.05)
        if not ctx.measure_start_ns:  # test_start fired before the context existed
            ctx.measure_start_ns = time.monotonic_ns() + int(ctx.point.warmup_s * 1e9)
        self._ctx = ctx
        self._http = self.client.client.clientpool.get_client(URL(ctx.point.base_url + ctx.path))
        # A stream switches its socket to the stall timeout after the first token; whatever path a request ends
        # on, the next one must start with the first-token timeout again, so set it whenever a socket is handed out.
        pool = connection_pool(self._http)
        get_socket = pool.get_socket
        first_token_s = ctx.point.first_token_s
        # Every read of this user's sockets leaves its arrival stamp here (kernel receive time on Linux; rxstamp).
        self._rx = rx = RxClock()

        def _get_socket():
            sock = get_socket()
            sock.settimeout(first_token_s)
            stamp_socket(sock, rx)
            rx.reset()  # one socket hand-out per request: its reads start here
            return sock

        pool.get_socket = _get_socket
        set_idle_socket_check(pool, idle_socket_alive)  # the same check minus gevent's yield (rxstamp)
        # A request that says `Connection: close` ends its connection (RFC 9112 9.6: the client sends nothing more
        # on it), whatever the response says: a server that closes without answering `connection: close` (the
        # emulator did) otherwise races the next request onto a dying socket (`connection_reset`).
        # This user's own pool: a finished response closes its socket instead of returning it.
        if any(k.lower() == "connection" and "close" in v.lower() for k, v in ctx.headers.items()):
            pool.return_socket = pool.release_socket
        self._index = ctx.users_started
        ctx.users_started += 1
        self._fire = self.environment.events.request.fire

    @task
    def stream(self) -> None:
        ctx = self._ctx
        if not ctx.prepared:  # a context built after test_start (the web UI's start form): prepare it now
            prepare = self.environment.servesweep.prepare
            if prepare is not None:
                prepare(ctx)
        if ctx.trace is not None:
            self._trace_start(ctx)
            return
        if ctx.point.arrival != "closed" and ctx.arrivals is None:
            gevent.sleep(0.01)  # open loop: the schedule starts with the test (test_start sets it)
            return
        slot = ctx.next_slot()
        if slot is None:
            # The point has issued all its requests: idle until the last one ends and the runner quits (a user
            # that stops itself leaves Locust complaining at shutdown).
            gevent.sleep(0.2)
            return
        scheduled, warm = slot
        wait_ns = scheduled - time.monotonic_ns()
        if wait_ns > 0:
            gevent.sleep(wait_ns / 1e9)  # open loop: until the slot (a busy cap makes it late instead)
            if ctx.closing:  # the point ended while this user waited: the slot is not used
                if not warm:
                    ctx.issued -= 1
                return
        if ctx.agent is not None:
            self._session(ctx, scheduled, warm)
            return
        body, out_tokens = ctx.next_request()
        rec = self._new_record(ctx, scheduled, warm, ctx.point.prompt_tokens, out_tokens, ctx.point.workload)
        self._send(ctx, body, rec, warm)

    def _new_record(
        self, ctx: LoadContext, scheduled: int, warm: bool, prompt: int, output: int, workload: str, **extra
    ) -> dict:
        """A request's record before it is sent (the rest comes from _do_request and parse_stream)."""
        return {
            "request_id": (f"{prefix}-" if (prefix := ctx.point.request_id_prefix) else "") + uuid.uuid4().hex,
            "point_id": ctx.point.id,
            "worker": ctx.worker,
            "user": self._index,
            "warmup": warm,
            "scheduled_ns": scheduled,
            "target_prompt_tokens": prompt,
            "target_output_tokens": output,
            "mono_to_wall_ns": ctx.mono_to_wall_ns,
            "http_status": 0,
            "workload": workload,
            **extra,
        }

    def _send(self, ctx: LoadContext, body: bytes, rec: dict, warm: bool) -> None:
        """Send one request and record it. In flight until its record is in the buffer: a worker ending a point then
        ships what it holds."""
        headers = dict(ctx.headers)
        headers["X-Request-Id"] = rec["request_id"]
        ctx.in_flight += 1
        try:
            self._do_request(ctx, body, headers, rec)
            self._finish(ctx, rec, warm)
        finally:
            ctx.in_flight -= 1

    def _finish(self, ctx: LoadContext, rec: dict, warm: bool) -> None:
        ctx.buffer.add(rec)
        self._report(ctx, rec)
        if not warm:
            ctx.completed += 1
            if rec.get("error_class") is not None:
                ctx.failed += 1
            n = ctx.share()
            if n is not None and ctx.completed >= n and not ctx.quit_requested:
                ctx.quit_requested = True
                gevent.spawn_later(ctx.quit_delay_s, ctx.on_budget_done or self.environment.runner.quit)

    def _session(self, ctx: LoadContext, scheduled: int, warm: bool) -> None:
        """One agent session: turns of the growing conversation, each a measured request (one of the budget)."""
        from servesweep.workload.build import AgentSession

        spec = ctx.agent
        assert spec is not None  # an agent point's context
        sid = uuid.uuid4().hex[:16]
        sess = AgentSession.start(spec, ctx.sessions_started, ctx.next_nonce(), sid)
        ctx.sessions_started += 1
        while True:
            prompt = ctx.point.prompt_tokens if sess.turn == 0 else 0  # later turns: no target length
            rec = self._new_record(
                ctx, scheduled, warm, prompt, spec.output_tokens, "agent", session_id=sid, turn=sess.turn
            )
            self._send(ctx, sess.body(), rec, warm)
            if rec.get("error_class") is not None:
                return  # a failed turn ends the session (its context is unknown)
            # the answer as the stream's parse kept it (delta.content joined, reasoning apart: a template drops it)
            answer = rec.get("response_text") or ""
            if not sess.advance(answer, rec.get("prompt_tokens"), rec.get("completion_tokens")):
                return
            if spec.think_time_s:
                gevent.sleep(spec.think_time_s)
            scheduled = time.monotonic_ns()  # the next turn follows the answer: closed within the session
            warm = scheduled < ctx.measure_start_ns
            if ctx.closing or (not warm and not ctx.claim()):
                return

    def _trace_start(self, ctx: LoadContext) -> None:
        """One start of a trace replay: at its slot, its request, or a session's turns in order (each its delay
        after the previous one ended, the delay already divided by the speed-up). Every request of the trace is
        measured (no warmup) and sent once, a failed turn included: the next turn's prompt is the trace's, not
        grown from the answer. A slot that finds every user busy is sent late and keeps its slot as `scheduled_ns`
        (the schedule lag, as in the open loop)."""
        sched = ctx.trace_schedule
        if sched is None:
            gevent.sleep(0.01)  # the schedule starts with the test (test_start sets it)
            return
        nxt = None if ctx.closing else sched.next_start()
        if nxt is None:
            gevent.sleep(0.2)  # this process's share is all handed out: idle until the runner quits
            return
        scheduled, start = nxt
        # Starts are handed out in slot order to the first free user: one handed out after its slot found every
        # user busy (sending, or holding a later slot's session) at that time: the concurrency cap held it back.
        bound = time.monotonic_ns() - scheduled > CAP_BOUND_LATE_NS
        self._trace_turns(ctx, sched, scheduled, start, bound)

    def _trace_turns(
        self, ctx: LoadContext, sched: TraceSchedule, scheduled: int, start: TraceStart, bound: bool
    ) -> None:
        spec = ctx.trace
        # a trace point's context, its schedule started
        assert spec is not None and sched.start_ns is not None
        reqs = spec.trace.requests
        prev_end = 0
        for k, i in enumerate(start.indices):
            if k:
                d = start.delays_ms[k]
                # a delay counts from the previous turn's end (its last read's arrival); a turn without one keeps
                # its own trace time
                own = sched.start_ns + start.offsets_ns[k]
                scheduled = prev_end + int(d * 1e6) if d is not None else max(prev_end, own)
            wait_ns = scheduled - time.monotonic_ns()
            if wait_ns > 0:
                gevent.sleep(wait_ns / 1e9)
            if ctx.closing or not ctx.claim():
                return
            r = reqs[i]
            head, tail = ctx.bodies[i]
            out = ctx.output_tokens[i] if ctx.output_tokens else r.output_length
            rec = self._new_record(
                ctx, scheduled, False, r.input_length, out, "trace",
                trace_index=i, session_id=r.session_id, turn=r.turn, cap_bound=bound and not k,
            )  # fmt: skip
            self._send(ctx, head + tail, rec, False)
            prev_end = rec["end_ns"]

    def _do_request(self, ctx: LoadContext, body: bytes, headers: dict, rec: dict) -> None:
        # One function on purpose: this is the per-chunk read path (one pass per socket read, kernel-stamped), the
        # cost bench/run_all.py's figure 1 measures; splitting it would add calls per chunk.
        p = ctx.point
        lines: list[bytes] = []
        times: list[int] = []
        first_seen = False
        resp = None
        rx = self._rx
        end_ns = 0  # the read that completed the HTTP message (its arrival stamp)
        total = gevent.Timeout(p.total_s, _TotalTimeout)
        total.start()
        rec["sent_ns"] = time.monotonic_ns()
        try:
            resp = self._http.request("POST", ctx.path, body=body, headers=headers)
            rec["headers_ns"] = rx.ns or time.monotonic_ns()  # arrival of the read that completed the headers
            rec["http_status"] = status = resp.status_code
            if status != 200:
                msg = error_message(resp.read())
                rec["error_class"] = classify_status(status, msg)
                rec["error_message"] = short(f"HTTP {status}: {msg}")
                return
            # A line's arrival is the stamp of the socket read that completed it (rxstamp: the kernel's receive
            # time on Linux). readline only reads when its buffer holds no whole line, so every line it returns was
            # completed by the latest read, whose stamp `rx.ns` holds; lines that came with the headers get the
            # header read's stamp.
            readline = resp.readline
            # Until the first token: the socket keeps the (long) first-token timeout; parse each line to spot it.
            while True:
                line = readline(b"\n")
                if not line:
                    end_ns = rx.ns
                    break
                lines.append(line)
                times.append(rx.ns)
                if is_token_line(line):
                    first_seen = True
                    sock = response_socket(resp)
                    if sock is not None:
                        sock.settimeout(p.stall_s)
                    break
            if first_seen:
                # The hot path, one pass per socket read: read (stamped), feed the HTTP parser (C: it de-chunks into
                # the response's body buffer), note how far the body reached and the read's stamp. Nothing else:
                # the lines are cut after the stream, each with the stamp of the read that completed it, exactly as
                # readline would have stamped them (readline cost two Python calls and a copy per event).
                buf = response_body_buffer(resp)  # the parser appends in place, nothing deletes
                reached = [len(buf)]
                stamps = [rx.ns]  # what the buffer holds now came with the latest read
                feed = resp.feed
                sock = response_socket(resp)  # None when the whole message came with the headers (released)
                block = resp.block_size
                try:
                    if sock is None:
                        if not resp.message_complete:
                            raise HTTPConnectionClosed("connection closed.")
                    else:
                        while not resp.message_complete:
                            data = sock.recv(block)
                            # b"" (peer closed): completes a read-to-close body or raises Incomplete
                            feed(data)
                            ctx.streamed_events += data.count(b"\n\n")  # one C scan of the read's bytes
                            if not data and not resp.message_complete:
                                raise HTTPConnectionClosed("connection closed.")
                            reached.append(len(buf))
                            stamps.append(rx.ns)
                    end_ns = rx.ns
                finally:  # also after a stall or a reset: the lines that came are kept
                    cut_lines(buf, reached, stamps, rx.ns, lines, times)
        except _TotalTimeout:
            rec["error_class"], rec["error_message"] = (
                "timeout_total",
                f"request exceeded total_s={p.total_s:g}",
            )
        except TimeoutError as e:
            if _in_connect(e):
                rec["error_class"], rec["error_message"] = (
                    "timeout_connect",
                    f"connect exceeded {p.connect_s:g}s",
                )
            elif not first_seen:
                rec["error_class"] = "timeout_first_token"
                rec["error_message"] = f"no token within first_token_s={p.first_token_s:g}"
            else:
                rec["error_class"] = "timeout_stall"
                rec["error_message"] = f"no chunk within stall_s={p.stall_s:g}"
        except (ConnectionError, HTTPConnectionClosed, HTTPParseError, OSError) as e:
            rec["error_class"], rec["error_message"] = "connection_reset", short(f"{type(e).__name__}: {e}")
        except gevent.GreenletExit:
            raise
        except Exception as e:  # noqa: BLE001 - a user must survive anything; the class makes it visible
            rec["error_class"], rec["error_message"] = "client_error", short(f"{type(e).__name__}: {e}")
        finally:
            total.close()
            rec["end_ns"] = end_ns or time.monotonic_ns()
            rec["rx_clock"] = rx.rx_clock()
            rec["read_lag_ns"] = rx.read_lag_ns()
            if resp is not None:
                resp.release()
        if rec.get("error_class") is None or lines:
            err = rec.get("error_class")
            err_msg = rec.get("error_message")
            try:
                parse_stream(lines, times, rec, pause=gevent.sleep)  # yields between slices (client/sse.py)
            except Exception as e:  # noqa: BLE001 - parse_stream never raises by design; if it does, keep the record
                rec["error_class"], rec["error_message"] = (
                    "client_error",
                    short(f"parse: {type(e).__name__}: {e}"),
                )
            if err is not None:  # a transport failure wins over what the partial stream says
                rec["error_class"], rec["error_message"] = err, err_msg

    def _report(self, ctx: LoadContext, rec: dict) -> None:
        """Locust's own stats: the POST row is E2E; LLM rows TTFT and E2E so the CSV/HTML/UI show them."""
        e2e_ms = (rec["end_ns"] - rec["sent_ns"]) / 1e6
        err = rec.get("error_class")
        self._fire(
            request_type="POST",
            name=ctx.path,
            response_time=e2e_ms,
            response_length=rec.get("completion_tokens") or 0,
            exception=LLMFailure(err) if err else None,
            # The finished request's record, for listeners (exporter, web UI) that must not read our buffer.
            context={RECORD_CONTEXT_KEY: rec},
        )
        if err is None:
            self._fire(
                request_type="LLM",
                name="TTFT",
                response_time=(rec["first_token_ns"] - rec["sent_ns"]) / 1e6,
                response_length=0,
                exception=None,
                context={},
            )
            self._fire(
                request_type="LLM",
                name="E2E",
                response_time=e2e_ms,
                response_length=rec.get("completion_tokens") or 0,
                exception=None,
                context={},
            )
