"""The emulator engine in simulated time (no HTTP, no sleeping), plus one real-time run on an asyncio loop."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import pytest

from servesweep.sglang.serverargs import resolve_server
from servesweep.sim.engine import Engine, EngineRequest, QueueFull

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def resolved(**kw):
    args = {"model_path": LLAMA, "sim_gpu": "H100"}
    args.update(kw)
    return resolve_server(args)


class Recorder:
    """Collects every emit: (virtual time, n tokens, finished) per request id."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.events: dict[str, list[tuple[float, int, bool]]] = {}
        self.done: dict[str, EngineRequest] = {}

    def __call__(self, req: EngineRequest, n: int, finished: bool) -> None:
        self.events.setdefault(req.rid, []).append((self.engine.now(), n, finished))
        if finished:
            assert req.rid not in self.done, "a request finished twice"
            self.done[req.rid] = req

    def req(self, rid, n_prompt, max_new, *, seed=None, ids=None, **kw) -> EngineRequest:
        if ids is None:
            rng = random.Random(seed if seed is not None else rid)
            ids = [rng.randrange(1, 100_000) for _ in range(n_prompt)]
        return EngineRequest(rid, ids, max_new, self, ignore_eos=kw.pop("ignore_eos", True), **kw)

    def itls(self, rid: str) -> list[float]:
        ev = self.events[rid]
        return [(b[0] - a[0]) / b[1] for a, b in zip(ev, ev[1:], strict=False) if b[1] > 0]


def ttft_of(eng: Engine, prompt: int) -> float:
    rec = Recorder(eng)
    r = rec.req("x", prompt, 4)
    eng.run_simulated([r])
    return r.first_token_time - r.queue_start


@pytest.mark.fast
def test_ttft_grows_with_prompt_length():
    res = resolved()
    t = [ttft_of(Engine(res), n) for n in (500, 4000, 16000, 64000)]
    assert t[0] < t[1] < t[2] < t[3]
    assert t[1] > 4 * t[0] and t[3] > 4 * t[2]  # superlinear in the end: the attention term is quadratic
    # 64k tokens at chunked_prefill_size 8192 take 8 prefill steps
    eng = Engine(res)
    ttft_of(eng, 64000)
    assert eng.stats().counters["prefill_steps"] == 8


@pytest.mark.fast
def test_itl_grows_with_batch_size_and_context():
    def mean_itl(batch, prompt):
        eng = Engine(resolved())
        rec = Recorder(eng)
        eng.run_simulated([rec.req(f"r{i}", prompt, 64) for i in range(batch)])
        return statistics.mean(x for rid in rec.events for x in rec.itls(rid))

    b1, b64, b256 = mean_itl(1, 200), mean_itl(64, 200), mean_itl(256, 200)
    # /metrics' gen_throughput reads the decode rate: 64 sequences x 1 token per step
    eng = Engine(resolved())
    rec = Recorder(eng)
    eng.run_simulated([rec.req(f"g{i}", 200, 300) for i in range(64)])
    assert eng.stats().gen_throughput == pytest.approx(64 / b64, rel=0.25)
    assert b1 < b64 < b256 and b256 > 1.2 * b1
    long_ctx = mean_itl(16, 60_000)
    assert long_ctx > 1.5 * mean_itl(16, 200)
    # an 8B model on an H100 decodes one sequence in the low milliseconds (weights / bandwidth)
    assert 0.004 < b1 < 0.012


@pytest.mark.fast
def test_long_prefill_stalls_running_decodes():
    eng = Engine(resolved())
    rec = Recorder(eng)
    a = rec.req("a", 100, 400)
    b = rec.req("b", 60_000, 2)
    eng.run_simulated([a, (0.2, b)])
    ev = rec.events["a"]
    gaps = [y[0] - x[0] for x, y in zip(ev, ev[1:], strict=False)]
    typical = statistics.median(gaps)
    stall = max(gaps)
    b_ttft = b.first_token_time - b.queue_start
    assert stall > 20 * typical
    # A waits through every prefill chunk of B: the stall is B's whole prefill, give or take one decode step
    assert stall >= 0.9 * (b_ttft - 2 * typical)
    assert a.finish_time > b.first_token_time


@pytest.mark.fast
def test_mixed_chunk_keeps_decoding_through_a_long_prefill():
    eng = Engine(resolved(enable_mixed_chunk=True))
    rec = Recorder(eng)
    a = rec.req("a", 100, 400)
    b = rec.req("b", 60_000, 2)
    eng.run_simulated([a, (0.2, b)])
    ev = rec.events["a"]
    gaps = [y[0] - x[0] for x, y in zip(ev, ev[1:], strict=False)]
    # each prefill chunk now also carries a's next token: the worst gap is one chunk, not the whole prefill
    assert max(gaps) < 0.4 * (b.first_token_time - b.queue_start)
    assert a.completion_tokens == 400


@pytest.mark.fast
def test_kv_capacity_causes_queueing():
    eng = Engine(resolved(max_total_tokens=5000))
    rec = Recorder(eng)
    max_queue = 0
    max_running = 0

    def watch(req, n, fin):
        nonlocal max_queue, max_running
        rec(req, n, fin)
        st = eng.stats()
        max_queue = max(max_queue, st.num_queue_reqs)
        max_running = max(max_running, st.num_running_reqs)
        assert st.num_used_tokens <= 5000

    reqs = [
        EngineRequest(f"r{i}", [i * 1000 + j for j in range(1000)], 200, watch, ignore_eos=True)
        for i in range(8)
    ]
    eng.run_simulated(reqs)
    assert len(rec.done) == 8 and all(r.completion_tokens == 200 for r in reqs)
    assert max_queue > 0 and max_running < 8
    waits = sorted(r.first_token_time - r.queue_start for r in reqs)
    assert waits[-1] > 3 * waits[0]  # the last admitted waited for others to finish


@pytest.mark.fast
def test_retraction_happens_and_all_requests_finish():
    eng = Engine(resolved(max_total_tokens=6000))
    rec = Recorder(eng)
    reqs = [rec.req(f"r{i}", 300, 1200) for i in range(10)]
    eng.run_simulated(reqs)
    st = eng.stats()
    assert st.counters["retractions"] > 0
    assert len(rec.done) == 10
    assert all(r.completion_tokens == 1200 and r.finish_reason == "length" for r in reqs)
    assert any(r.num_retractions > 0 for r in reqs)
    # the tokens a client receives add up exactly, retraction or not
    for r in reqs:
        assert sum(n for _, n, _ in rec.events[r.rid]) == 1200
    assert st.num_used_tokens == 0 or st.num_running_reqs == 0


@pytest.mark.fast
def test_radix_cache_hits_repeated_prompt_not_across_namespaces_and_flush():
    eng = Engine(resolved())
    rec = Recorder(eng)
    ids = list(range(5, 3005))
    first = rec.req("a", 0, 8, ids=ids)
    eng.run_simulated([first])
    again = rec.req("b", 0, 8, ids=ids)
    eng.run_simulated([again])
    other_ns = rec.req("c", 0, 8, ids=ids, cache_namespace="salt-1")
    eng.run_simulated([other_ns])
    assert first.cached_tokens == 0
    assert again.cached_tokens == 2999  # all but the last token, whose logits sample the output
    assert other_ns.cached_tokens == 0
    assert (again.first_token_time - again.queue_start) < 0.3 * (first.first_token_time - first.queue_start)
    # a shared prefix hits up to the 16-token block where prompts diverge
    shared = rec.req("d", 0, 8, ids=ids[:2000] + [7] * 500)
    eng.run_simulated([shared])
    assert 1984 <= shared.cached_tokens <= 2000
    assert eng.stats().counters["cached_tokens"] == again.cached_tokens + shared.cached_tokens
    assert eng.flush_cache() is True
    after = rec.req("e", 0, 8, ids=ids)
    eng.run_simulated([after])
    assert after.cached_tokens == 0


@pytest.mark.fast
def test_flush_cache_refuses_while_busy():
    eng = Engine(resolved())
    answers = []

    def emit(req, n, fin):
        answers.append(eng.flush_cache())

    eng.run_simulated([EngineRequest("a", list(range(100)), 5, emit, ignore_eos=True)])
    assert answers and not any(answers[:-1])  # refused while the request was running
    assert eng.flush_cache() is True


@pytest.mark.fast
def test_spec_decoding_emits_accept_length_tokens_per_step():
    res = resolve_server(
        {"model_path": "Qwen/Qwen3.6-27B", "speculative_algorithm": "NEXTN", "speculative_num_steps": 3}
    )
    eng = Engine(res, calibration={"spec_accept_mean": 2.5}, seed=3)
    rec = Recorder(eng)
    reqs = [rec.req(f"r{i}", 200, 2000) for i in range(8)]
    eng.run_simulated(reqs)
    per_step = [n for rid in rec.events for _, n, _ in rec.events[rid][1:-1]]  # skip prefill token and tail
    assert max(per_step) == 4 and min(per_step) >= 1
    assert statistics.mean(per_step) == pytest.approx(2.5, rel=0.04)
    st = eng.stats()
    assert st.spec_accept_length == pytest.approx(2.5, rel=0.04)
    assert all(r.spec_verify_ct > 0 and r.completion_tokens == 2000 for r in reqs)
    # default table for NEXTN with 3 steps when not calibrated
    assert Engine(res).accept_model.mean == pytest.approx(2.75, abs=0.01)


@pytest.mark.fast
def test_eos_stops_early_with_seeded_lengths():
    def lengths(seed):
        eng = Engine(resolved(), seed=seed)
        rec = Recorder(eng)
        reqs = [rec.req(f"r{i}", 50, 1000, ignore_eos=False) for i in range(40)]
        eng.run_simulated(reqs)
        return [(r.completion_tokens, r.finish_reason) for r in reqs]

    a = lengths(1)
    assert a == lengths(1) and a != lengths(2)
    assert all(1 <= n <= 1000 for n, _ in a)
    assert any(f == "stop" for _, f in a) and statistics.median(n for n, _ in a) < 500


@pytest.mark.fast
def test_abort_queue_full_and_too_long_input():
    eng = Engine(resolved(max_queued_requests=2, max_running_requests=1))
    rec = Recorder(eng)
    a, b, c = rec.req("a", 100, 50), rec.req("b", 100, 50), rec.req("c", 100, 50)

    def abort_b(req, n, fin):
        rec(req, n, fin)
        if req.rid == "a" and req.completion_tokens == 10:
            assert eng.abort("b") is True

    a.emit = abort_b
    eng.run_simulated([])  # enter simulated mode: submissions queue until the next run
    eng.submit(a)
    eng.submit(b)
    with pytest.raises(QueueFull):
        eng.submit(c)
    eng.run_simulated()
    assert b.finish_reason == "abort" and [e[1:] for e in rec.events["b"]] == [(0, True)]
    assert a.completion_tokens == 50 and eng.abort("a") is False  # already finished
    eng.submit(c)
    eng.run_simulated()
    assert c.completion_tokens == 50 and c.finish_reason == "length"

    long_eng = Engine(resolved(max_total_tokens=2000))
    r2 = Recorder(long_eng)
    big = r2.req("big", 3000, 10)
    long_eng.run_simulated([big])
    assert big.finish_reason == "abort" and big.abort_status == 400
    assert big.abort_message == (
        "Input length (3000 tokens) exceeds the maximum allowed length (1994 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


def test_real_time_loop_emits_on_schedule_without_drift():
    res = resolved()

    async def main():
        eng = Engine(res, calibration={"speedup": 2.0})
        eng.start(asyncio.get_running_loop())
        late: list[float] = []
        done = asyncio.Event()
        finished = 0
        t_start = time.monotonic()

        def emit(req, n, fin):
            nonlocal finished
            # the engine's schedule for this emission is t0 + virtual time at the step's end
            late.append(time.monotonic() - (eng._t0 + eng._vt))
            if fin:
                finished += 1
                if finished == 40:
                    done.set()

        for i in range(40):
            eng.submit(EngineRequest(f"r{i}", list(range(i, i + 300)), 200, emit, ignore_eos=True))
        await asyncio.wait_for(done.wait(), 30)
        wall = time.monotonic() - t_start
        await eng.stop()
        return wall, eng._vt, late

    wall, vt, late = asyncio.run(main())
    assert vt > 0.2  # the run took real engine time
    assert abs(wall - vt) < 0.1 + 0.15 * vt  # wall clock tracks the virtual clock: no drift
    late.sort()
    assert late[len(late) // 2] < 0.01


@pytest.mark.fast
def test_data_parallel_ranks_multiply_capacity_and_throughput():
    def tput(dp):
        eng = Engine(resolved(dp_size=dp, max_running_requests=16 * dp))
        rec = Recorder(eng)
        reqs = [rec.req(f"r{i}", 500, 200) for i in range(32)]
        end = eng.run_simulated(reqs)
        return sum(r.completion_tokens for r in reqs) / end, eng.stats()

    one, st1 = tput(1)
    two, st2 = tput(2)
    assert st2.max_total_num_tokens == 2 * st1.max_total_num_tokens
    assert 1.6 * one < two < 2.2 * one  # two ranks serve 32 requests where one serves 16 at a time


@pytest.mark.fast
def test_kv_never_over_its_pool_when_retracted_requests_come_back():
    """12 closed-loop users on a 3000-token pool with 8 running slots (Qwen3.6-27B, as
    tests/results/test_server_state.py runs it): decode runs out of KV, requests are retracted, and a retracted
    request finds its own prompt in the radix cache when it comes back. Matching locks that prefix, which was
    evictable a moment before, so the room left shrinks by it (SGLang's add_one_req: "rem_total_tokens may decrease
    after the lock acquisition"). The emulator used to admit against the room before the lock and reached
    token_usage 1.048 (3144 of 3000 tokens) at seed 0; under the suite's load the real-time test saw 1.04."""
    worst, retracted = 0.0, 0
    for seed in range(20):
        eng = Engine(resolve_server({"model_path": "Qwen/Qwen3.6-27B", "sim_gpu": "H200", "max_running_requests": 8,
                                     "max_total_tokens": 3000, "context_length": 4096}))  # fmt: skip
        rng = random.Random(seed)
        left = [24]

        def emit(req, n, finished, eng=eng, left=left, rng=rng):
            nonlocal worst
            worst = max(worst, eng.stats().token_usage)
            if finished and left[0] > 0:
                left[0] -= 1
                eng.submit(make(rng))

        def make(rng, emit=emit):
            ids = [rng.randrange(1, 100_000) for _ in range(400)]
            return EngineRequest(f"r{rng.random()}", ids, 160, emit, ignore_eos=True)

        eng.run_simulated([(rng.random() * 0.05, make(rng)) for _ in range(12)])
        retracted += eng.c_retractions
    assert retracted > 0, "the pool is small enough that decode retracts"
    assert 0.9 < worst <= 1.0, worst
