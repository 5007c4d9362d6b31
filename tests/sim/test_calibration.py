"""The built-in A6000 profile reproduces the field measurements of real SGLang 0.5.11 within 10%.

Field: 2x RTX A6000, TP2, Qwen3.6-27B, NEXTN with 3 steps, `--mamba-scheduler-strategy extra_buffer`,
SGLANG_ENABLE_SPEC_V2=1; 1000-token prompts, 500-token outputs, ignore_eos, closed loop at a fixed concurrency.
The engine runs in simulated time: clients send their next request the moment the last one finishes.
"""

from __future__ import annotations

import random

import pytest

from servesweep.sglang.serverargs import resolve_server
from servesweep.sim.engine import Engine, EngineRequest

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

FIELD = {1: 73.5, 2: 137.7, 4: 207.1}  # aggregate output tok/s (per request at concurrency 1)

ARGS = {
    "model_path": "Qwen/Qwen3.6-27B",
    "tp_size": 2,
    "sim_gpu": "RTX A6000",
    "speculative_algorithm": "NEXTN",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "mamba_scheduler_strategy": "extra_buffer",
    "sim_sglang_version": "0.5.11",
}


def closed_loop(
    concurrency: int, rounds: int = 4, seed: int = 0
) -> tuple[float, Engine, list[EngineRequest]]:
    resolved = resolve_server(ARGS, {"SGLANG_ENABLE_SPEC_V2": "1"})
    eng = Engine(resolved, seed=seed)
    rng = random.Random(seed)
    total = concurrency * rounds
    sent: list[EngineRequest] = []

    def new() -> EngineRequest:
        ids = [rng.randrange(1, 248_000) for _ in range(1000)]  # distinct prompts: no prefix-cache help
        r = EngineRequest(f"r{len(sent)}", ids, 500, on_emit, ignore_eos=True)
        sent.append(r)
        return r

    def on_emit(req: EngineRequest, n: int, finished: bool) -> None:
        if finished and len(sent) < total:
            eng.submit(new())

    end = eng.run_simulated([new() for _ in range(concurrency)])
    out = sum(r.completion_tokens for r in sent)
    assert len(sent) == total and all(
        r.finish_reason == "length" and r.completion_tokens == 500 for r in sent
    )
    return out / end, eng, sent


@pytest.mark.parametrize("concurrency", sorted(FIELD))
def test_field_throughput_within_10_percent(concurrency):
    tput, eng, reqs = closed_loop(concurrency)
    assert tput == pytest.approx(FIELD[concurrency], rel=0.10), f"c={concurrency}: {tput:.1f} tok/s"
    st = eng.stats()
    assert 3.0 < st.spec_accept_length <= 4.0  # chunks carry several tokens
    assert st.counters["retractions"] == 0


def test_fit_is_stable_across_seeds_and_run_lengths():
    for seed, rounds in ((1, 2), (2, 6)):
        for c, field in FIELD.items():
            tput, _, _ = closed_loop(c, rounds=rounds, seed=seed)
            assert tput == pytest.approx(field, rel=0.10), f"seed={seed} rounds={rounds} c={c}: {tput:.1f}"


def test_profile_is_the_a6000_default_and_overridable():
    resolved = resolve_server(ARGS)
    assert Engine(resolved).cal.spec_accept_mean == pytest.approx(3.8)
    slower = Engine(resolved, calibration={"bw_eff": 0.7})
    assert slower.model.decode(1, 1500) > 1.2 * Engine(resolved).model.decode(1, 1500)
    with pytest.raises(ValueError, match="unknown key 'bw'"):
        Engine(resolved, calibration={"bw": 1})
