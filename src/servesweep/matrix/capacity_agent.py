"""Agent sessions as the load of a capacity search: the largest number of concurrent agent sessions per SLO tier.

With `load.workload: agent` a Locust user runs one multi-turn session at a time (workload/build.py, docs/workloads.md:
a shared tools description, a task, then turns that append the answer and a tool result, so each turn's prompt is
the last one plus new tokens and the radix cache serves the rest). A closed-loop concurrency of C is therefore C
concurrent sessions, and the search's concurrency axis is the number of concurrent sessions.

What changes for a probe of agent sessions:
- its requests are turns, judged per turn (TTFT, ITL, TPOT of every turn, early and late, cache hits included);
- it must see whole sessions, not only first turns: a probe of C sessions asks for at least C × (session_turns + 1)
  turns (`min_rounds` = session_turns + 1 instead of 2), so every session slot reaches its last, longest turn at
  least once after the warm-up, which may cut the first session of each slot;
- its row in capacity.json says `load_unit: sessions`, and its figures at capacity add the sessions' own: sessions
  seen, turns per session, TTFT p99 of first and of later turns, and the later turns' cache hit ratio.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

AGENT = "agent"


def is_agent(template: Mapping[str, Any]) -> bool:
    """Whether a search's point template (the manifest's `searches[sid].template`) runs agent sessions."""
    return template.get("workload") == AGENT


def search_overrides(template: Mapping[str, Any]) -> dict[str, Any]:
    """SearchSpec fields an agent search sets: first calls of C × (session_turns + 1) turns (whole sessions after a
    warm-up that may cut each slot's first one)."""
    if not is_agent(template):
        return {}
    turns = int((template.get("point") or {}).get("session_turns") or 1)
    return {"min_rounds": float(max(2, turns + 1))}


def load_unit(workload: str, axis: str) -> str:
    """What a capacity counts: concurrent agent sessions, concurrent requests (users) or requests per second."""
    if axis == "rate":
        return "req/s"
    return "sessions" if workload == AGENT else "concurrency"


def session_figures(record_files: Iterable[Path]) -> dict[str, Any]:
    """The sessions of a probe's calls at one load (their records.parquet, warm-up left out): sessions seen, mean
    turns per session, sessions whose last (longest) turn was measured, TTFT p99 of first turns and of later turns
    (ms), the later turns' cache hit ratio. Sessions cut by the warm-up or by the probe's end count as seen with the
    turns they had, so `turns_per_session` is below session_turns even when every slot ran whole sessions."""
    from servesweep.results.metrics import request_metrics
    from servesweep.results.records import read_parquet

    sids: list[Any] = []
    turns: list[np.ndarray] = []
    ttft: list[np.ndarray] = []
    cached: list[np.ndarray] = []
    prompt: list[np.ndarray] = []
    for f in record_files:
        t = read_parquet(f)
        keep = ~t.column("warmup").to_numpy(zero_copy_only=False).astype(bool)
        t = t.filter(keep)
        ok = np.array([e is None for e in t.column("error_class").to_pylist()], dtype=bool)
        sids += [f"{f.parent.name}/{s}" for s in t.column("session_id").to_pylist()]  # ids are per call
        turns.append(t.column("turn").to_numpy(zero_copy_only=False).astype(np.float64))
        ttft.append(request_metrics(t, ok).ttft_ms)
        cached.append(np.where(ok, t.column("cached_tokens").to_numpy(zero_copy_only=False).astype(float), np.nan))
        prompt.append(np.where(ok, t.column("prompt_tokens").to_numpy(zero_copy_only=False).astype(float), np.nan))
    if not turns:
        return {}
    turn, tt, ca, pr = (np.concatenate(x) for x in (turns, ttft, cached, prompt))
    later = turn >= 1

    def p99(a: np.ndarray) -> float | None:
        a = a[np.isfinite(a)]
        return float(np.percentile(a, 99)) if a.size else None

    has = later & np.isfinite(ca) & np.isfinite(pr)
    sessions = len(set(sids))
    last = turn == turn.max()
    return {
        "sessions": sessions,
        "turns_per_session": float(turn.size / sessions) if sessions else None,
        "sessions_at_last_turn": len({s for s, is_last in zip(sids, last, strict=True) if is_last}),
        "ttft_p99_first_turn_ms": p99(tt[~later]),
        "ttft_p99_later_turns_ms": p99(tt[later]),
        "later_turns_cache_hit_ratio": float(ca[has].sum() / pr[has].sum()) if has.any() and pr[has].sum() else None,
    }
