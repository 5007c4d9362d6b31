"""Timing a client measures over HTTP follows the engine's model: TTFT grows with the prompt, ITL with the batch,
and a small KV pool makes requests queue."""

from __future__ import annotations

import statistics

import pytest

from servesweep.sim.launch import start_sim
from servesweep.sim.probe import probe, probe_many, run

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CHAT = "/v1/chat/completions"


def chat(words: int, max_tokens: int, salt: str) -> dict:
    return {
        "messages": [{"role": "user", "content": " ".join(["alpha"] * words)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "cache_salt": salt,  # no prefix reuse between requests
    }


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--model-path", LLAMA]) as s:  # H200 profile
        yield s


def test_ttft_grows_with_prompt_length(sim):
    ttft = {}
    for n in (
        100,
        8000,
        100,
        8000,
    ):  # alternate, keep the best of two (a loaded machine adds noise, never removes)
        r = run(probe(sim.host, sim.port, CHAT, chat(n, 4, f"ttft-{n}-{len(ttft)}-{id(ttft)}")))
        ttft[n] = min(ttft.get(n, 1e9), r.ttft_s)
    assert ttft[8000] > 3 * ttft[100]
    assert ttft[8000] - ttft[100] > 0.1  # ~0.27 s of prefill for 8k tokens of an 8B model on an H200


def test_itl_grows_with_batch_size(sim):
    def median_itl(batch: int) -> float:
        res = run(
            probe_many(sim.host, sim.port, CHAT, [chat(2000, 60, f"itl-{batch}-{i}") for i in range(batch)])
        )
        # ITL during the phase where every request decodes: drop each request's first gaps (others still prefill).
        # Per request its mean gap over that span, not the median of single gaps: a client reading late gets several
        # SSE events in one read, microseconds apart (a loaded cold run read the batch's median gap at 1.2 us),
        # while the span's length divided by its tokens does not depend on how the reads fell
        def mean_gap(r) -> float:
            te = r.token_events()[10:]
            return (te[-1][0] - te[0][0]) / 1e9 / (len(te) - 1)

        return statistics.median(mean_gap(r) for r in res)

    # alternate, keep the best of three: a loaded machine adds noise, never removes it (a cold run with 5 test
    # workers on 2 cores once read a single request's median ITL at 5.5 ms against the batch's 3.4 ms)
    single = batched = 1e9
    for _ in range(3):
        single, batched = min(single, median_itl(1)), min(batched, median_itl(32))
    assert batched > 1.25 * single, (single, batched)


def test_small_kv_pool_makes_requests_queue():
    # 3000 KV tokens hold two 1000-token prompts plus their reserved output, not four
    with start_sim(["--model-path", LLAMA, "--max-total-tokens", "3000", "--sim-gpu", "A6000"]) as sim:
        res = run(probe_many(sim.host, sim.port, CHAT, [chat(990, 60, f"kv-{i}") for i in range(4)]))
        assert all(len(r.token_events()) == 60 for r in res)
        order = sorted(res, key=lambda r: r.ttft_s)
        first_done = min((r.end_ns - r.send_ns) / 1e9 for r in order[:2])
        # the last two only start once a running request has finished and freed its KV
        assert order[2].ttft_s > 0.8 * first_done, ([r.ttft_s for r in order], first_done)
        assert order[1].ttft_s < 0.5 * order[2].ttft_s
