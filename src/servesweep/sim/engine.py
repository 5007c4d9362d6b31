"""The emulator's engine: one discrete-event loop with one clock that batches requests the way SGLang's scheduler does.

Each step is either a prefill (extend) batch or a decode batch (SGLang runs them separately unless mixed chunk is on,
so a long prefill stalls every running decode). The step-time model (`servesweep.sglang.stepmodel`) prices the batch, the virtual
clock advances by that duration, and at the step's end time, absolute on one clock (`loop.call_at`, never a sleep per
request, so no drift accumulates), every sequence in the batch gets one `emit(req, n_new_tokens, finished)` call.

SGLang rules followed (python/sglang/srt/managers/): FCFS waiting queue; admission against free + evictable KV and
`max_running_requests` with the `new_token_ratio` reservation for running requests (schedule_policy.py PrefillAdder);
chunked prefill at `chunked_prefill_size` and `max_prefill_tokens` per batch; decode KV growth per committed token;
retraction when decode runs out of KV (scheduler retract_decode: the request with the least output, longest input
first, its KV freed, re-queued, recomputed later); the radix cache (a prompt's longest cached prefix, within its
namespace, skips prefill and counts as cached tokens; finished prompts stay cached, LRU-evictable); speculative
decoding commits accept-length tokens per verify step.

The engine runs on the server's asyncio loop (`start`), or in simulated time with no event loop and no sleeping
(`run_simulated`), which tests and the planner use.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servesweep.sglang.serverargs import ResolvedServer
from servesweep.sglang.speculative import AcceptModel, accept_model
from servesweep.sglang.stepmodel import Calibration, StepModel, calibration_for
from servesweep.sim.deadline import DeadlineTimer

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: reservation cap per request
INIT_NEW_TOKEN_RATIO = 0.7  # schedule_conservativeness 1.0 x SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20  # after a retraction the remaining batch must have room for this many steps
SPIN_S = 0.0015  # without a timerfd: wake this early on a loop timer and yield to the loop until the deadline
HR_EARLY_S = 0.0002  # with one: wake this early (covers a wake-up's latency) and yield until the deadline
GEN_THROUGHPUT_INTERVAL = 40  # decode steps per gen_throughput window (--decode-log-interval)

_WAITING, _PREFILL, _RUNNING, _DONE = 0, 1, 2, 3


@dataclass(slots=True, eq=False)
class EngineRequest:
    rid: str
    prompt_ids: Sequence[int]  # token ids after chat templating (for length and the radix cache)
    max_new_tokens: int
    emit: Callable[[EngineRequest, int, bool], None]  # (req, n_new_tokens, finished) at the step's end time
    ignore_eos: bool = False
    cache_namespace: str | None = None  # cache_salt / extra_key: prefix matches only within a namespace
    # greedy requests (temperature 0): the EOS draw's own seed, so the same prompt stops at the same length on
    # every server of the same model, as a greedy model does
    eos_seed: int | None = None
    # filled in by the engine:
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "length" | "stop" | "abort"
    abort_status: int | None = None
    abort_message: str | None = None
    spec_verify_ct: int = 0
    queue_start: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_retractions: int = 0
    # engine-private state
    _state: int = 0
    _target: int = 0  # output length this request will reach (max_new_tokens, or an EOS draw)
    _need: int = 0  # input tokens to be in KV before decoding (prompt, plus output after a retraction)
    _fill: int = 0  # input tokens in KV so far (cached prefix + prefilled)
    _alloc: int = 0  # KV tokens this request owns (page-rounded), not counting shared cache blocks
    _keys: list[int] | None = None  # radix block chain of the prompt
    _sizes: list[int] | None = None
    _locked: int = 0  # leading blocks of _keys this request holds a reference on
    _arrival_seq: int = 0
    _fwd_entry: float = 0.0  # engine time of its first prefill step's start (per_stage_req_latency_seconds)
    _chunk_done: float = 0.0  # engine time its last middle prefill chunk ended
    _queued_s: float | None = None  # queue_time's value, set at its first forward entry

    @property
    def queue_time(self) -> float | None:
        """Its wait in the waiting queue, as SGLang's `sglang:queue_time_seconds` observes it (req_time_stats.py
        `set_forward_entry_time`: once per request, its first forward entry minus its wait-queue entry; a wait after
        a retraction is not observed again): seconds, None before its first forward (or without one: aborted while
        waiting, rejected at validation)."""
        return self._queued_s


class QueueFull(Exception):
    """--max-queued-requests reached (the server answers 503 "The request queue is full.")."""


@dataclass(slots=True)
class EngineStats:
    num_running_reqs: int
    num_queue_reqs: int
    num_used_tokens: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    spec_accept_length: float
    spec_accept_rate: float
    max_total_num_tokens: int
    new_token_ratio: float
    num_retracted_reqs: int  # retracted in the last retraction event (gauge)
    evictable_tokens: int
    mamba_usage: float  # hybrid models: state slots in use / max_mamba_cache_size (0 otherwise)
    counters: dict[str, int] = field(default_factory=dict)


class Engine:
    def __init__(
        self,
        resolved: ResolvedServer,
        *,
        seed: int = 0,
        calibration: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.resolved = resolved
        self.cal: Calibration = calibration_for(resolved, calibration)
        self.model = StepModel(resolved, self.cal)
        self._rng = random.Random(seed)
        self._clock = clock
        # Data parallelism is modelled as a fluid split: dp ranks with their own KV pools and request limits run
        # side by side, so capacities scale by dp and the step model prices 1/dp of each batch (SGLang's DP
        # controller round-robins requests; real ranks drift apart, this keeps them in step).
        dp = max(1, int(resolved.dp_size))
        self._total = int(resolved.max_total_num_tokens) * dp
        self._mrr = max(1, int(resolved.effective_max_running_requests)) * dp
        self._maxq = resolved.max_queued_requests
        self._chunk = resolved.chunked_prefill_size * dp if resolved.chunked_prefill_size > 0 else 1 << 62
        self._max_prefill = max(1, int(resolved.max_prefill_tokens)) * dp
        self._page = max(1, int(resolved.page_size))
        # Radix blocks: page-granular; with page_size 1 blocks of 16 tokens plus an exact tail block keep the
        # per-request hashing cost at O(prompt/16) while an identical prompt still matches to the token.
        self._blk = self._page if self._page > 1 else 16
        self._radix = bool(resolved.radix_cache)
        self._max_input = int(resolved.max_req_input_len)
        self._spec: AcceptModel | None = None
        if resolved.spec_algorithm is not None:
            self._spec = accept_model(
                resolved.spec_algorithm,
                num_steps=resolved.spec_num_steps,
                eagle_topk=resolved.spec_eagle_topk,
                num_draft_tokens=resolved.spec_num_draft_tokens,
                mean=self.cal.spec_accept_mean or None,
                tree=resolved.spec_algorithm
                not in ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"),
            )
        self._q = int(resolved.spec_num_draft_tokens or 1) if self._spec else 1
        self._mixed = bool(resolved.args.get("enable_mixed_chunk")) and self._spec is None
        self._eos_mu = math.log(max(1.0, self.cal.eos_median_tokens))
        self._noise = self.cal.noise_sigma

        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._chunked: EngineRequest | None = None
        self._by_rid: dict[str, EngineRequest] = {}
        self._used = 0  # KV tokens owned by requests
        self._cache: OrderedDict[int, list[int]] = OrderedDict()  # block key -> [tokens, refs]
        self._cache_tokens = 0
        self._locked_tokens = 0
        self._ratio = INIT_NEW_TOKEN_RATIO
        self._seq = 0

        # counters / gauges
        self.c_prompt_tokens = 0
        self.c_generation_tokens = 0
        self.c_cached_tokens = 0
        self.c_requests = 0
        self.c_finished = 0
        self.c_aborted = 0
        self.c_retractions = 0
        self.c_verify = 0
        self.c_spec_tokens = 0
        self.c_decode_steps = 0
        self.c_prefill_steps = 0
        self._last_retracted = 0
        # counters SGLang sets on an event, so its families appear after the first one (sim/events.py)
        self.c_retracted_input_tokens = 0
        self.c_retracted_output_tokens = 0
        self.c_realtime = {"prefill_compute": 0, "prefill_cache": 0, "decode": 0}  # realtime_tokens_total
        self._pending_hit = 0  # cached tokens of the prefill step in flight, counted when it ends
        # (stage, seconds) of a request, as SGLang's RequestStage observes them; set by sim/exposition.py
        self.on_stage: Callable[[str, float], None] | None = None
        self.c_busy_s = 0.0  # engine-clock seconds spent in steps (sglang:fwd_occupancy)
        self._last_hit_rate = 0.0
        self._gen_tokens_window = 0
        self._gen_window_start = 0.0
        self._gen_window_steps = 0
        self._gen_throughput = 0.0

        # clock
        self._vt = 0.0  # virtual time, seconds since _t0
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sim = False
        self._busy = False
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._hr: DeadlineTimer | None = None  # exact wake-ups (timerfd) when the clock is time.monotonic
        self._deadline = 0.0
        # the step being emitted: its scheduled end, time.monotonic_ns() (ground truth: lateness = write - this)
        self.sched_ns = 0
        self._inflight: tuple | None = None
        self._stopped = False
        # server-wide faults (sim/faults.py ServerFaults): every step this many times slower; a hung engine
        # never ends its step in flight nor starts another
        self.slowdown = 1.0
        self.hung = False

    # ---------------------------------------------------------------- public API
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin serving on `loop`; steps are scheduled with loop.call_at at absolute end times."""
        self._loop = loop
        if self._hr is None and self._clock is time.monotonic:
            self._hr = DeadlineTimer.create(loop)
        self._t0 = self._clock()
        self._vt = 0.0
        self._stopped = False
        if self.waiting:
            self._kick()

    async def stop(self) -> None:
        self._halt()
        if self._hr is not None:
            self._hr.close()
            self._hr = None
        self._busy = False

    def hang(self) -> None:
        """Stop dead (a hung GPU or collective): the step in flight never ends, nothing runs again, requests that
        arrive wait forever. Only `stop` (the process's end) follows."""
        self.hung = True
        self._halt()

    def _halt(self) -> None:
        """No step ends or starts from here on: both step timers disarmed (the high-resolution one stays open)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._hr is not None:
            self._hr.cancel()

    def now(self) -> float:
        """The engine's notion of the current time (the clock's units; virtual seconds in simulated mode)."""
        if self._sim:
            return self._vt
        return self._clock()

    def submit(self, req: EngineRequest) -> None:
        if self._maxq is not None and len(self.waiting) >= self._maxq:
            raise QueueFull("The request queue is full.")
        if req.rid in self._by_rid:
            raise ValueError(f"Duplicate request ID detected: {req.rid}")  # tokenizer_manager.py's text
        req.queue_start = self.now() if not self._sim else self._vt
        self._seq += 1
        req._arrival_seq = self._seq
        req._state = _WAITING
        n_in = len(req.prompt_ids)
        self.c_requests += 1
        if n_in >= self._max_input:
            # scheduler.py::_handle_generate_request -> validate_input_length: aborted after the HTTP 200.
            msg = (
                f"Input length ({n_in} tokens) exceeds the maximum allowed length ({self._max_input} tokens). "
                f"Use a shorter input or enable --allow-auto-truncate."
            )
            self._abort_later(req, 400, msg)
            return
        max_new = max(0, int(req.max_new_tokens))
        if req.ignore_eos or max_new == 0:
            req._target = max_new
        else:
            rng = self._rng if req.eos_seed is None else random.Random(req.eos_seed)
            draw = int(rng.lognormvariate(self._eos_mu, self.cal.eos_sigma))
            req._target = max(1, min(max_new, draw))
        req._need = n_in
        self._by_rid[req.rid] = req
        self.waiting.append(req)
        self._stage("request_process", 0.0)  # received and queued at once: SGLang's receive-to-queue stage
        self._kick()

    def abort(self, rid: str) -> bool:
        """Graceful abort: the request leaves the engine at once and gets emit(req, 0, True), finish "abort"."""
        req = self._by_rid.get(rid)
        if req is None or req._state == _DONE:
            return False
        if req._state == _WAITING:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        elif req is self._chunked:
            self._chunked = None
        elif req._state == _RUNNING:
            try:
                self.running.remove(req)
            except ValueError:
                pass
        self._release(req)
        req.finish_reason = "abort"
        req.abort_message = req.abort_message or "Aborted by AbortReq."
        self._finish(req, self.now())
        self.c_aborted += 1
        req.emit(req, 0, True)
        return True

    def flush_cache(self) -> bool:
        """Empty the radix cache; refuses (False) while requests are running or waiting, as SGLang does."""
        if self.running or self.waiting or self._chunked is not None or self._inflight is not None:
            return False
        self._cache.clear()
        self._cache_tokens = 0
        self._locked_tokens = 0
        return True

    def stats(self) -> EngineStats:
        used = self._used + self._locked_tokens
        spec_len = self.c_spec_tokens / self.c_verify if self.c_verify else 0.0
        k = self._q - 1 if self._spec else 0
        rate = (spec_len - 1.0) / k if (self.c_verify and k > 0) else 0.0
        return EngineStats(
            num_running_reqs=len(self.running) + (1 if self._chunked is not None else 0),
            num_queue_reqs=len(self.waiting),
            num_used_tokens=used,
            token_usage=used / self._total if self._total else 0.0,
            gen_throughput=self._gen_throughput,
            cache_hit_rate=self._last_hit_rate,
            spec_accept_length=spec_len,
            spec_accept_rate=rate,
            max_total_num_tokens=self._total,
            new_token_ratio=self._ratio,
            num_retracted_reqs=self._last_retracted,
            evictable_tokens=self._cache_tokens - self._locked_tokens,
            mamba_usage=self._mamba_usage(),
            counters={
                "prompt_tokens": self.c_prompt_tokens,
                "generation_tokens": self.c_generation_tokens,
                "cached_tokens": self.c_cached_tokens,
                "requests": self.c_requests,
                "finished": self.c_finished,
                "aborted": self.c_aborted,
                "retractions": self.c_retractions,
                "verify_calls": self.c_verify,
                "decode_steps": self.c_decode_steps,
                "prefill_steps": self.c_prefill_steps,
            },
        )

    def _mamba_usage(self) -> float:
        slots = self.resolved.state_slots
        if not slots:
            return 0.0
        # each running request holds its state plus the ping-pong/track slots of its strategy (the "mamba ratio")
        per_req = max(1, self.resolved.mamba_ratio)
        running = len(self.running) + (1 if self._chunked is not None else 0)
        return min(1.0, running * per_req / slots)

    def scheduled_time(self) -> float:
        """The end time of the step in flight on the engine's clock: inside an emit callback, the instant this
        emission was scheduled for (ground truth compares the actual write time against it)."""
        return self._vt if self._sim else self._t0 + self._vt

    @property
    def accept_model(self) -> AcceptModel | None:
        return self._spec

    # ---------------------------------------------------------------- simulated time
    def run_simulated(
        self,
        requests: Iterable[EngineRequest | tuple[float, EngineRequest]] = (),
        *,
        until: float | None = None,
        max_steps: int = 50_000_000,
    ) -> float:
        """Run in virtual time (no event loop, no sleeping) until idle; return the virtual time reached.

        `requests` are EngineRequests submitted now, or (delay, request) pairs arriving `delay` seconds after now. `emit` callbacks may call
        `submit` (closed-loop clients): the request arrives at the current virtual time. `now()` reads virtual time.
        """
        self._sim = True
        heap: list[tuple[float, int, EngineRequest]] = []
        start = self._vt
        for i, item in enumerate(requests):
            t, r = item if isinstance(item, tuple) else (0.0, item)
            heapq.heappush(heap, (start + float(t), i, r))
        steps = 0
        while steps < max_steps:
            while heap and heap[0][0] <= self._vt + 1e-12:
                t, _, r = heapq.heappop(heap)
                self.submit(r)
                r.queue_start = t
            dur = self._begin_step()
            if dur is None:
                if heap:
                    self._vt = max(self._vt, heap[0][0])
                    self._restart_gen_window()
                    continue
                break
            self._vt += dur
            self.c_busy_s += dur
            self._end_step(self._vt)
            steps += 1
            if until is not None and self._vt >= until:
                break
        return self._vt

    def _restart_gen_window(self) -> None:
        # gen_throughput measures busy periods: a window that saw no decode step starts when work resumes
        if self._gen_window_steps == 0:
            self._gen_window_start = self._vt

    # ---------------------------------------------------------------- real-time driver
    def _kick(self) -> None:
        if self._sim or self._busy or self._loop is None or self._stopped:
            return
        self._busy = True
        # call_soon: requests submitted in the same loop iteration join one batch.
        self._loop.call_soon(self._resume)

    def _resume(self) -> None:
        now_vt = self._clock() - self._t0
        if now_vt > self._vt:
            self._vt = now_vt  # idle: the clock jumps to now
        self._restart_gen_window()
        self._schedule_next()

    def _schedule_next(self) -> None:
        if self._stopped:
            self._busy = False
            return
        dur = self._begin_step()
        if dur is None:
            self._busy = False
            return
        self._vt += dur
        self.c_busy_s += dur
        loop = self._loop
        assert loop is not None
        # Absolute deadline on the engine's clock: no drift. The last stretch before it yields to the loop with
        # call_soon until the deadline passes (emissions land on time, never early); before that the loop sleeps.
        # A timerfd wakes it HR_EARLY_S ahead (µs-grained; a wake-up takes tens of µs on a busy VM). Loop timers
        # are millisecond-grained (libuv fires up to ~1 ms early or late), so without a timerfd the loop timer,
        # mapped onto the loop's clock (uvloop's differs), wakes SPIN_S ahead, which costs that much CPU per step.
        self._deadline = self._t0 + self._vt
        delay = self._deadline - self._clock()
        if self._hr is not None:
            if delay > HR_EARLY_S:
                self._hr.arm(self._deadline - HR_EARLY_S, self._spin)
            else:
                self._timer = loop.call_soon(self._spin)
            return
        if delay > SPIN_S:
            self._timer = loop.call_at(loop.time() + delay - SPIN_S, self._spin)
        else:
            self._timer = loop.call_soon(self._spin)

    def _spin(self) -> None:
        if self._clock() < self._deadline:
            assert self._loop is not None
            self._timer = self._loop.call_soon(self._spin)
            return
        self._on_step_end()

    def _on_step_end(self) -> None:
        self._timer = None
        self.sched_ns = int(self._deadline * 1e9)
        self._end_step(self._t0 + self._vt)
        self._schedule_next()

    def _abort_later(self, req: EngineRequest, status: int, message: str) -> None:
        req.finish_reason = "abort"
        req.abort_status = status
        req.abort_message = message
        req._state = _DONE
        self.c_aborted += 1

        def fire() -> None:
            req.finish_time = self.now()
            req.emit(req, 0, True)

        if self._sim or self._loop is None:
            fire()
        else:
            self._loop.call_soon(fire)

    # ---------------------------------------------------------------- one step
    def _begin_step(self) -> float | None:
        """Form the next batch (prefill first, else decode), reserve its KV, and return its duration.

        With --enable-mixed-chunk (and no speculative decoding, as in SGLang) a prefill step also carries one
        decode token of every running request, so long prefills do not stall decodes.
        """
        running_before = bool(self.running)
        batch = self._form_prefill()
        if batch is not None:
            reqs, ns, n_new, sum_prefix, area = batch
            dec = self._prepare_decode() if (self._mixed and running_before) else None
            if dec is None:
                dur = self.model.prefill(len(reqs), n_new, sum_prefix, area)
                self._inflight = (True, reqs, ns, None)
            else:
                run, dns, sum_ctx = dec
                b = len(run)
                dur = self.model.prefill(len(reqs) + b, n_new + b, sum_prefix + sum_ctx, area + sum_ctx)
                self._inflight = (True, reqs, ns, (run, dns))
            self.c_prefill_steps += 1
        else:
            dec = self._prepare_decode()
            if dec is None:
                self._inflight = None
                return None
            run, dns, sum_ctx = dec
            dur = self.model.decode(len(run), sum_ctx)
            self._inflight = (False, run, dns, None)
        if self._noise > 0:
            dur *= self._rng.lognormvariate(0.0, self._noise)
        if self.slowdown != 1.0:  # --sim-crawl-after: the only per-step cost of the server faults
            dur *= self.slowdown
        return dur

    def _prepare_decode(self) -> tuple[list[EngineRequest], list[int] | None, int] | None:
        """Make room for one decode step of every running request, draw its accept lengths, reserve its KV."""
        if not self.running:
            return None
        self._check_decode_mem()
        run = self.running
        if not run:
            return None
        b = len(run)
        ns = self._spec.sample(self._rng, b) if self._spec is not None else None
        sum_ctx = 0
        grow = 0
        for i, r in enumerate(run):
            sum_ctx += r._need + r.completion_tokens
            n = ns[i] if ns is not None else 1
            left = r._target - r.completion_tokens
            if n > left:
                n = left
                if ns is not None:
                    ns[i] = n
            r._alloc += n
            grow += n
        self._used += grow
        self._evict(self._used + self._cache_tokens - self._total)
        self.c_decode_steps += 1
        if self._ratio > MIN_NEW_TOKEN_RATIO:
            self._ratio = max(MIN_NEW_TOKEN_RATIO, self._ratio - NEW_TOKEN_RATIO_DECAY)
        return list(run), ns, sum_ctx

    def _end_step(self, t_end: float) -> None:
        inflight = self._inflight
        self._inflight = None
        if inflight is None:
            return
        is_prefill, reqs, ns, mixed = inflight
        if mixed is not None:
            self._end_decode(mixed[0], mixed[1], t_end)
        if is_prefill:
            self._end_prefill(reqs, ns, t_end)
        else:  # SGLang counts decode tokens of decode batches (a mixed batch reports as a prefill)
            self.c_realtime["decode"] += self._end_decode(reqs, ns, t_end)

    def _end_decode(self, reqs: list[EngineRequest], ns: list[int] | None, t_end: float) -> int:
        spec = ns is not None
        total = 0
        finished: list[EngineRequest] = []
        for i, r in enumerate(reqs):
            if r._state != _RUNNING:
                continue  # aborted or retracted while the step ran
            n = ns[i] if ns is not None else 1  # (spec)
            r.completion_tokens += n
            total += n
            if spec:
                r.spec_verify_ct += 1
            done = r.completion_tokens >= r._target
            if done:
                finished.append(r)
                r.finish_reason = "length" if r._target >= r.max_new_tokens else "stop"
                self._finish(r, t_end)
            r.emit(r, n, done)
        if finished:
            gone = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in gone]
            for r in finished:
                self._release(r)
        self.c_generation_tokens += total
        if spec:
            self.c_verify += len(reqs)
            self.c_spec_tokens += total
        # gen_throughput over a window of decode steps, as SGLang's decode log computes it.
        self._gen_tokens_window += total
        self._gen_window_steps += 1
        vt = self._vt
        if self._gen_window_steps >= GEN_THROUGHPUT_INTERVAL:
            span = vt - self._gen_window_start
            if span > 0:
                self._gen_throughput = self._gen_tokens_window / span
            self._gen_tokens_window = 0
            self._gen_window_steps = 0
            self._gen_window_start = vt
        elif self._gen_throughput == 0.0 and vt > self._gen_window_start:
            self._gen_throughput = self._gen_tokens_window / (vt - self._gen_window_start)
        return total

    def _end_prefill(self, reqs: list[EngineRequest], ns: list[int], t_end: float) -> None:
        self.c_realtime["prefill_cache"] += self._pending_hit
        self._pending_hit = 0
        for r, n in zip(reqs, ns, strict=True):
            if r._state != _PREFILL:
                continue
            r._fill += n
            self.c_realtime["prefill_compute"] += n  # new and replayed (after a retraction) input tokens
            if r._fill < r._need:  # more chunks to go; it stays the chunked request
                self._stage("chunked_prefill", t_end - (r._chunk_done or r._fwd_entry))
                r._chunk_done = t_end
                continue
            if r.num_retractions == 0:  # SGLang observes a request's first prefill only
                self._stage("prefill_forward", t_end - r._fwd_entry)
            if r is self._chunked:
                self._chunked = None
            if self._radix and r._keys is not None:
                self._insert_prompt(r)
            # The prefill step samples the first token (also after a retraction: the next token).
            if r._target <= r.completion_tokens:
                r.finish_reason = "length"
                self._finish(r, t_end)
                self._release(r)
                r.emit(r, 0, True)
                continue
            r.completion_tokens += 1
            self.c_generation_tokens += 1
            if r.first_token_time is None:
                r.first_token_time = t_end
            done = r.completion_tokens >= r._target
            if done:
                r.finish_reason = "length" if r._target >= r.max_new_tokens else "stop"
                self._finish(r, t_end)
                self._release(r)
            else:
                r._state = _RUNNING
                self.running.append(r)
            r.emit(r, 1, done)

    # ---------------------------------------------------------------- scheduling policy
    def _form_prefill(self):
        """PrefillAdder (schedule_policy.py): the chunked request first, then waiting requests in FCFS order."""
        if not self.waiting and self._chunked is None:
            return None
        active = len(self.running) + (1 if self._chunked is not None else 0)
        if self._chunked is None and active >= self._mrr:
            return None
        rem_chunk = self._chunk
        rem_input = self._max_prefill
        free = self._total - self._used - self._cache_tokens
        evictable = self._cache_tokens - self._locked_tokens
        reserve = 0.0
        ratio = self._ratio
        for r in self.running:
            left = min(r.max_new_tokens - r.completion_tokens, CLIP_MAX_NEW_TOKENS)
            if left > 0:
                reserve += left * ratio
        rem_total = free + evictable - reserve
        reqs: list[EngineRequest] = []
        ns: list[int] = []
        n_new = sum_prefix = 0
        area = 0.0
        page = self._page

        def take(r: EngineRequest, n: int) -> None:
            """`n` of r's tokens into this prefill: allocated, counted into the batch and its chunk and input
            budgets (rem_total apart: the chunk and a new request reserve differently)."""
            nonlocal n_new, sum_prefix, area, rem_chunk, rem_input
            self._alloc_tokens(r, n)
            reqs.append(r)
            ns.append(n)
            n_new += n
            sum_prefix += r._fill
            area += n * (r._fill + n / 2)
            rem_chunk -= n
            rem_input -= n

        c = self._chunked
        if c is not None:
            left = c._need - c._fill
            # SGLang's available_chunk_tokens (prefill_budget.py, one pool): the chunk within what is left of the
            # KV budget, a full chunk when none is left (a continuation must progress to release its KV) ...
            budget = min(rem_chunk, int(rem_total))
            if budget <= 0:
                budget = rem_chunk
            # ... and never more than the pool holds now (SGLang's allocator would have nothing more to give; the
            # emulator used to take the whole chunk regardless): the decode step retracts to make room, and the
            # chunk waits for it
            room = free + evictable
            if self.running and room < min(left, budget):
                budget = room // page * page
                if budget <= 0:
                    return None
            n = min(left, budget)
            if n < left:
                n = max(page, n // page * page)
            take(c, n)
            rem_total -= n
            if n < left:
                return reqs, ns, n_new, sum_prefix, area
            active += 0  # it completes this step and stays counted

        while self.waiting and active < self._mrr and rem_chunk > 0:
            r = self.waiting[0]
            locked = self._locked_tokens
            prefix = self._match(r) if (self._radix and r._fill == 0) else r._fill
            # schedule_policy.py add_one_req: "rem_total_tokens may decrease after the lock acquisition": the
            # matched prefix was evictable and is now locked (a retracted request finds its own prompt in the
            # cache); without this the emulator admitted it into KV it did not have (token_usage 1.05)
            rem_total -= self._locked_tokens - locked
            extend = r._need - prefix
            max_new_left = max(0, min(r.max_new_tokens - r.completion_tokens, CLIP_MAX_NEW_TOKENS))
            total = -(-extend // page) * page + max_new_left  # page-aware: the extend occupies whole pages
            if total > rem_total and (reqs or self.running):
                self._unmatch(r)
                break  # NO_TOKEN: wait for KV to free up
            if extend > rem_input and reqs:
                self._unmatch(r)
                break
            self.waiting.popleft()
            r._state = _PREFILL
            if r._fill == 0 and prefix:
                r.cached_tokens = prefix if r.num_retractions == 0 else r.cached_tokens
                r._fill = prefix
            if r.num_retractions == 0:
                self.c_prompt_tokens += len(r.prompt_ids)
                self.c_cached_tokens += prefix
                r._fwd_entry = self._t0 + self._vt  # this step's start (forward entry)
                r._queued_s = max(0.0, (self._vt if self._sim else r._fwd_entry) - r.queue_start)
            self._pending_hit += prefix
            hit_total = r._need
            self._last_hit_rate = prefix / hit_total if hit_total else 0.0
            n = extend
            chunked = False
            if n > rem_chunk:
                n = max(page, rem_chunk // page * page)
                chunked = True
            take(r, n)
            rem_total -= total
            active += 1
            if chunked:
                self._chunked = r
                break
        if not reqs:
            return None
        return reqs, ns, n_new, sum_prefix, area

    def _alloc_tokens(self, r: EngineRequest, n: int) -> None:
        r._alloc += n
        self._used += n
        self._evict(self._used + self._cache_tokens - self._total)

    def _check_decode_mem(self) -> None:
        """scheduler.py update_running_batch: retract when the next decode step's KV does not fit."""
        need = len(self.running) * self._q
        if self._available() >= need:
            return
        self._evict(need - (self._total - self._used - self._cache_tokens))
        if self._total - self._used - self._cache_tokens >= need:
            return
        # retract_decode: least output first (then longest input), until the rest has room for 20 steps.
        order = sorted(self.running, key=lambda r: (r.completion_tokens, -r._need), reverse=True)
        retracted = 0
        while len(order) > 1 and self._available() < len(order) * self._q * RETRACT_DECODE_STEPS:
            r = order.pop()
            self.c_retracted_input_tokens += len(r.prompt_ids)  # SGLang: origin_input_ids, output_ids
            self.c_retracted_output_tokens += r.completion_tokens
            self._retract(r)
            retracted += 1
        if retracted:
            keep = set(map(id, order))
            self.running = [r for r in self.running if id(r) in keep]
            self._last_retracted = retracted
            self.c_retractions += retracted
            self._ratio = INIT_NEW_TOKEN_RATIO
        self._evict(len(self.running) * self._q - (self._total - self._used - self._cache_tokens))
        if self.running and self._total - self._used - self._cache_tokens < len(self.running) * self._q:
            # One request alone does not fit: it stops at the KV limit (SGLang would be out of memory).
            r = self.running.pop()
            r.finish_reason = "length"
            self._finish(r, self.now())
            self._release(r)
            r.emit(r, 0, True)

    def _retract(self, r: EngineRequest) -> None:
        self._release(r)
        r._state = _WAITING
        r._fill = 0
        r._need = len(r.prompt_ids) + r.completion_tokens
        r.num_retractions += 1
        self.waiting.appendleft(r)  # keeps its place ahead of later arrivals

    def _stage(self, stage: str, seconds: float) -> None:
        if self.on_stage is not None:
            self.on_stage(stage, seconds)

    def _available(self) -> int:
        return self._total - self._used - self._locked_tokens

    def _release(self, r: EngineRequest) -> None:
        """Free the request's own KV and drop its references on cache blocks."""
        self._used -= r._alloc
        r._alloc = 0
        if r._locked and r._keys is not None:
            self._release_locks_only(r)

    def _finish(self, r: EngineRequest, t: float) -> None:
        r._state = _DONE
        r.finish_time = t
        self._by_rid.pop(r.rid, None)
        self.c_finished += 1

    # ---------------------------------------------------------------- radix cache
    def _chain(self, r: EngineRequest) -> None:
        ids = r.prompt_ids
        blk = self._blk
        h = hash(("ns", r.cache_namespace))
        keys: list[int] = []
        sizes: list[int] = []
        n = len(ids)
        full = n - n % blk
        if not isinstance(ids, (list, tuple)):
            ids = list(ids)
        for i in range(0, full, blk):
            h = hash((h, tuple(ids[i : i + blk])))
            keys.append(h)
            sizes.append(blk)
        if full < n and self._page == 1:
            keys.append(hash((h, tuple(ids[full:]))))
            sizes.append(n - full)
        r._keys, r._sizes = keys, sizes

    def _match(self, r: EngineRequest) -> int:
        """Longest cached prefix within the namespace, page-aligned, leaving at least one token to compute."""
        if r._keys is None:
            self._chain(r)
        keys, sizes = r._keys, r._sizes
        assert keys is not None and sizes is not None
        cache = self._cache
        matched = 0
        tokens = 0
        limit = len(r.prompt_ids) - 1  # the last token is always recomputed (its logits sample the output)
        for key, size in zip(keys, sizes, strict=True):
            node = cache.get(key)
            if node is None:
                break
            if tokens + size > limit:
                if self._page == 1 and tokens < limit:
                    # token-granular radix (page_size 1): the block matches up to the limit
                    matched += 1
                    tokens = limit
                break
            matched += 1
            tokens += size
        if not matched:
            return 0
        for i in range(matched - 1, -1, -1):  # parents end up most recent: LRU evicts leaves first
            key = keys[i]
            node = cache[key]
            if node[1] == 0:
                self._locked_tokens += node[0]
            node[1] += 1
            cache.move_to_end(key)
        r._locked = matched
        return tokens // self._page * self._page

    def _unmatch(self, r: EngineRequest) -> None:
        if r._locked:
            self._release_locks_only(r)

    def _release_locks_only(self, r: EngineRequest) -> None:
        """Drop the request's references on the cache blocks it holds (a block no one holds becomes evictable)."""
        cache = self._cache
        assert r._keys is not None
        for key in r._keys[: r._locked]:
            node = cache.get(key)
            if node is not None:
                node[1] -= 1
                if node[1] == 0:
                    self._locked_tokens -= node[0]
        r._locked = 0

    def _insert_prompt(self, r: EngineRequest) -> None:
        """After prefill the prompt's blocks move into the cache, held by this request until it finishes."""
        keys, sizes = r._keys, r._sizes
        assert keys is not None and sizes is not None
        cache = self._cache
        moved = 0
        for i in range(r._locked, len(keys)):
            key = keys[i]
            size = sizes[i]
            node = cache.get(key)
            if node is None:
                cache[key] = [size, 1]
                self._cache_tokens += size
                self._locked_tokens += size
            else:
                if node[1] == 0:
                    self._locked_tokens += node[0]
                node[1] += 1
                cache.move_to_end(key)
            moved += size
        moved = min(moved, r._alloc)
        r._alloc -= moved
        self._used -= moved
        r._locked = len(keys)

    def _evict(self, need: int) -> None:
        """Evict unreferenced cache blocks, least recently used first, until `need` tokens are freed."""
        if need <= 0 or not self._cache:
            return
        cache = self._cache
        freed = 0
        victims: list[int] = []
        for key, node in cache.items():  # oldest first; stop as soon as enough is found
            if node[1] == 0:
                victims.append(key)
                freed += node[0]
                if freed >= need:
                    break
        for key in victims:
            self._cache_tokens -= cache.pop(key)[0]


def simulate_closed_loop(
    resolved: ResolvedServer,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    num_requests: int,
    calibration: Mapping[str, Any] | None = None,
    seed: int = 0,
    ignore_eos: bool = True,
    unique_prompts: bool = True,
) -> dict[str, float]:
    """A closed-loop benchmark in simulated time: `concurrency` clients each send the next request when the last
    one finishes. Returns aggregate output tok/s, mean per-request decode speed, TTFT and ITL.

    Prompts are random ids per request (no cache hits) unless unique_prompts is False.
    """
    eng = Engine(resolved, seed=seed, calibration=calibration)
    rng = random.Random(seed + 1)
    results: list[EngineRequest] = []
    sent = 0
    itl_sum = 0.0
    itl_n = 0
    last_emit: dict[str, float] = {}

    def make() -> EngineRequest:
        nonlocal sent
        sent += 1
        if unique_prompts:
            ids = [rng.randrange(1, 150000) for _ in range(prompt_tokens)]
        else:
            ids = list(range(prompt_tokens))
        return EngineRequest(f"r{sent}", ids, output_tokens, on_emit, ignore_eos=ignore_eos)

    def on_emit(req: EngineRequest, n: int, finished: bool) -> None:
        nonlocal itl_sum, itl_n
        t = eng.now()
        prev = last_emit.get(req.rid)
        if prev is not None and n:
            itl_sum += (t - prev) / n
            itl_n += 1
        last_emit[req.rid] = t
        if finished:
            results.append(req)
            last_emit.pop(req.rid, None)
            if sent < num_requests:
                eng.submit(make())

    first = [make() for _ in range(min(concurrency, num_requests))]
    end = eng.run_simulated(first)
    out = sum(r.completion_tokens for r in results)
    ttft = [r.first_token_time - r.queue_start for r in results if r.first_token_time is not None]
    per_req = [
        r.completion_tokens / (r.finish_time - r.queue_start)
        for r in results
        if r.finish_time is not None and r.finish_time > r.queue_start
    ]
    st = eng.stats()
    return {
        "duration_s": end,
        "completed": len(results),
        "output_throughput": out / end if end else 0.0,
        "per_request_tok_s": sum(per_req) / len(per_req) if per_req else 0.0,
        "mean_ttft_s": sum(ttft) / len(ttft) if ttft else 0.0,
        "mean_itl_s": itl_sum / itl_n if itl_n else 0.0,
        "accept_length": st.spec_accept_length,
        "retractions": st.counters["retractions"],
    }
