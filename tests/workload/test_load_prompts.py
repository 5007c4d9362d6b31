"""Long-context points through the server's own usage: prompt-token accuracy at 30k and 100k, and cache busting
checked through `cached_tokens` (the emulator's radix cache with --enable-cache-report)."""

from __future__ import annotations

import pytest

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

# speedup: a 100k prefill of the emulated 27B model takes seconds in real time; 20x keeps the test short
SIM_ARGS = ["--model-path", "Qwen/Qwen3.6-27B", "--enable-cache-report", "--sim-calibration", "speedup=20"]


@pytest.fixture(scope="module")
def sim():
    with start_sim(SIM_ARGS) as s:
        yield s


@pytest.mark.parametrize(
    "endpoint, prompt_tokens", [("chat", 30_000), ("chat", 100_000), ("completions", 3_000)]
)
def test_long_prompt_token_accuracy(sim, tmp_path, endpoint, prompt_tokens):
    p = LoadPoint(
        base_url=sim.base_url,
        endpoint=endpoint,
        concurrency=2,
        prompt_tokens=prompt_tokens,
        output_tokens=4,
        requests=2,
    )
    s = run_point(p, tmp_path)
    assert s["requests"]["ok"] == 2, s["failures"]
    acc = s["prompt_tokens"]
    assert acc["reported"] == 2
    # the bound; the emulator counts like the pool does
    assert acc["max_abs_deviation_pct"] <= 0.5, acc
    assert s["cache_hit_ratio"] <= 0.01
    recs = read_parquet(tmp_path / "records.parquet").to_pylist()
    assert all(abs(r["prompt_tokens"] - prompt_tokens) <= prompt_tokens * 0.005 for r in recs)


def test_cache_busting_on_and_off(sim, tmp_path):
    """The same prompt sent four times in a row: with the nonce the radix cache cannot serve it; without, it does."""
    common = dict(
        base_url=sim.base_url, concurrency=1, prompt_tokens=3000, output_tokens=4, requests=4, pool_size=1
    )
    busted = run_point(LoadPoint(**common, seed=11), tmp_path / "bust")
    shared = run_point(LoadPoint(**common, seed=12, cache_bust=False), tmp_path / "shared")
    assert busted["cache_hit_ratio"] <= 0.01
    # requests 2..4 of the shared run find the whole prompt but its last tokens in the cache: about 3/4 overall
    assert shared["cache_hit_ratio"] >= 0.5, shared["cache_hit_ratio"]
    cached = [r["cached_tokens"] for r in read_parquet(tmp_path / "shared" / "records.parquet").to_pylist()]
    assert cached[0] == 0 and min(cached[1:]) > 2500
