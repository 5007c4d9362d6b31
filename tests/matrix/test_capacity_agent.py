"""Capacity in concurrent agent sessions (matrix/capacity_agent.py) on the emulator: a closed loop of C users is C
sessions of growing contexts served from the radix cache; the search's axis is the number of sessions, every probe
sees whole sessions (C × (session_turns + 1) turns at least) and is judged per turn. The true capacity comes from a small
grid of the same sessions, and the search must land within one step of it."""

from __future__ import annotations

import time
from itertools import count
from pathlib import Path

import numpy as np
import pytest

from servesweep.matrix.capacity_agent import load_unit, search_overrides, session_figures
from servesweep.matrix.capacity_search import ProbeResult, SearchSpec, parse_tier, search

MODEL = "Qwen/Qwen3.6-27B"
TURNS = 3
# Each running sequence adds 4 ms to every step (÷2 by speedup): per-turn TPOT grows ~2 ms per concurrent session.
EMULATOR = ["--model-path", MODEL, "--sim-calibration", "per_seq_s=0.004,speedup=2", "--enable-cache-report"]


def agent_probe(base_url: str, root: Path, files: dict[int, list[Path]]):
    """probe(sessions, turns): one run_point of agent sessions (3 turns: 256-token first prompt, half of it the
    shared tools description; 32-token tool results; 8-token answers), `turns` measured turns in all."""
    from servesweep.config.point import LoadPoint
    from servesweep.driver.point_run import run_point
    from servesweep.results.records import read_parquet

    k = count()

    def probe(load: int, requests: int) -> ProbeResult:
        p = LoadPoint(
            base_url=base_url, model=MODEL, probe=False, template_overhead=0, continuous_usage=False,
            workload="agent", endpoint="chat", concurrency=int(load), prompt_tokens=256, output_tokens=8,
            session_turns=TURNS, tool_result_tokens=32, requests=requests, warmup_s=0.2,
        )  # fmt: skip
        out = root / f"s{load}-{next(k)}"
        t0 = time.monotonic()
        run_point(p, out)
        files.setdefault(int(load), []).append(out / "records.parquet")
        return ProbeResult.from_records(read_parquet(out / "records.parquet"), wall_s=time.monotonic() - t0)

    return probe


@pytest.mark.timeout(300)
def test_agent_sessions_capacity_matches_a_grid_of_sessions(tmp_path):
    from servesweep.sim.launch import start_sim

    template = {"workload": "agent", "point": {"session_turns": TURNS}}
    over = search_overrides(template)
    assert over == {"min_rounds": float(TURNS + 1)} and load_unit("agent", "concurrency") == "sessions"
    assert search_overrides({"workload": "chat", "point": {}}) == {}
    with start_sim(EMULATOR) as sim:
        grid_files: dict[int, list[Path]] = {}
        grid = agent_probe(sim.base_url, tmp_path / "grid", grid_files)
        tpot = {c: float(np.nanmedian(grid(c, 12 * c).tpot_ms)) for c in range(2, 8)}
        # the threshold halfway across the widest step of 3..6 sessions: the true capacity is unambiguous
        cap = max(range(3, 7), key=lambda c: tpot[c + 1] - tpot[c])
        assert tpot[cap + 1] - tpot[cap] >= 1.0, tpot
        ms = (tpot[cap] + tpot[cap + 1]) / 2
        tiers = {"speed": parse_tier(f"decode_tokens_per_s_p50>={1000 / ms:.1f}")}
        files: dict[int, list[Path]] = {}
        spec = SearchSpec(axis="concurrency", start=2, lower=1, upper=32, rel=0.0, step=1, max_seconds=90.0, **over)
        res = search(agent_probe(sim.base_url, tmp_path / "search", files), tiers, spec)
    t = res.tiers["speed"]
    print(f"\nagent grid TPOT p50 ms {({c: round(v, 2) for c, v in tpot.items()})}; true capacity {cap} sessions; "
          f"search {t.capacity} {t.bracket} in {res.probes_used} probes ({res.calls} calls)")  # fmt: skip
    assert t.stop == "resolution" and abs(t.capacity - cap) <= 1, (t, cap)
    # every first call of a load saw whole sessions: at least sessions × (turns + 1) turns
    assert all(p.result.n >= (TURNS + 1) * p.load for p in res.probes), [(p.load, p.result.n) for p in res.probes]
    # the sessions at capacity: every slot reached its last, longest turn; contexts grown from the cache. (Mean turns
    # per session is no check: the warm-up cuts the first sessions' first turns, the probe's end the last sessions.)
    s = session_figures(files[t.capacity])
    assert s["sessions"] >= t.capacity and s["sessions_at_last_turn"] >= t.capacity, s
    assert s["later_turns_cache_hit_ratio"] > 0.5, s  # each turn's prompt is the last one plus new tokens
    assert s["ttft_p99_first_turn_ms"] is not None and s["ttft_p99_later_turns_ms"] is not None
