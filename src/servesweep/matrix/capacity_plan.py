"""What `servesweep plan` says about a `search:` block: the start estimate and the probes and time of each search.

The step model (the emulator's, through the planner's timer) predicts each request's TTFT, TPOT, ITL and E2E at a
load; the capacity search (matrix/capacity_search.py) then runs against that prediction as its probe. The model's requests
are all alike, so every statistic's interval is a point and the search decides as soon as a statistic has its
minimum samples: the probes, top-ups and requests it counts are the ones the real search takes when the model is
right. The first tier's predicted capacity is the real search's start.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from servesweep.matrix.capacity_search import ProbeResult, SearchSpec, parse_tier, search

MAX_QUEUE_S = 1e6  # an open loop above the server's throughput: the queue grows without bound


def predicted(timer, rs, prompt: int, output: int, concurrency: float) -> dict[str, float]:
    """Per-request latencies (s) and throughput of a closed loop of `concurrency` users: b = min(users, running
    cap) run at once; a request's decode is stalled by the b - 1 other prefills of its lifetime; the users above b
    wait for earlier waves."""
    b = max(1, min(int(concurrency), rs.effective_max_running_requests))
    prefill = timer.prefill_s(prompt)
    steps = math.ceil(max(1, output - 1) / timer.accept)
    step = timer.decode_step_s(b, prompt + output // 2)
    decode = steps * step + (b - 1) * prefill
    wave = b * prefill + steps * step
    ttft = prefill * (b + 1) / 2 + max(0.0, concurrency / b - 1) * wave
    tpot = decode / max(1, output - 1)
    e2e = ttft + decode
    return {"ttft": ttft, "tpot": tpot, "itl": step, "e2e": e2e, "throughput": concurrency / e2e}


def predicted_open(timer, rs, prompt: int, output: int, rate: float, cap: int) -> dict[str, float]:
    """An open loop at `rate` req/s: the running requests n = rate × E2E (Little's law), found by fixed point; at
    or above the most the server completes (cap or running limit users) the queue grows: TTFT without bound."""
    limit = min(cap, rs.effective_max_running_requests)
    most = predicted(timer, rs, prompt, output, limit)
    if rate >= most["throughput"]:
        return {**most, "ttft": MAX_QUEUE_S, "e2e": MAX_QUEUE_S, "throughput": most["throughput"]}
    n = 1.0
    for _ in range(30):
        p = predicted(timer, rs, prompt, output, min(max(1.0, n), limit))
        n = rate * p["e2e"]
    utilisation = rate / most["throughput"]
    wait = p["e2e"] * utilisation / (1 - utilisation) / max(1, limit)  # queueing of random arrivals
    return {**p, "ttft": p["ttft"] + wait, "e2e": p["e2e"] + wait, "throughput": rate}


def model_probe(timer, rs, exp, prompt: int, output: int, log: list[float], rate_per_load: float | None = None):
    """A probe for search(): n identical requests at the predicted values; its cost (the time the real probe
    would take) is appended to `log` and given as wall_s. A speed-up search (a trace replay) is an open loop at
    load × `rate_per_load` req/s (the trace's mean rate at speed 1)."""
    axis = exp.search.axis

    def probe(load, n: int) -> ProbeResult:
        if axis == "concurrency":
            p = predicted(timer, rs, prompt, output, load)
            window = n / p["throughput"]
        else:
            rate = load * rate_per_load if axis == "speedup" and rate_per_load else load
            p = predicted_open(timer, rs, prompt, output, rate, max(exp.load.concurrency))
            window = n / rate
        steps = max(1, output - 1)
        ms = {k: np.full(n, min(v, MAX_QUEUE_S) * 1000.0) for k, v in p.items() if k != "throughput"}
        wall = window + exp.load.warmup_s
        log.append(wall)
        return ProbeResult(
            ok=np.ones(n, dtype=bool),
            ttft_ms=ms["ttft"],
            tpot_ms=ms["tpot"],
            e2e_ms=ms["e2e"],
            completion_tokens=np.full(n, float(output)),
            window_s=window,
            itl_ms=np.full(n * steps, p["itl"] * 1000.0),
            itl_owner=np.repeat(np.arange(n), steps),
            wall_s=wall,
        )

    return probe


def spec_for(block, start: float | None, **over: Any) -> SearchSpec:
    """The SearchSpec of an experiment's search block, started at `start` (None: block.start, else lower)."""
    first = block.start if block.start is not None else (start if start is not None else block.lower)
    return SearchSpec(
        axis=block.axis,
        start=block.load_value(first),
        lower=block.load_value(block.lower),
        upper=block.load_value(block.upper),
        rel=block.rel,
        step=block.step,
        max_probes=block.max_probes,
        max_seconds=block.max_time_s,
        confidence=block.confidence,
        max_requests=block.max_requests,
        **over,
    )


def price_search(
    exp,
    rs,
    timer,
    prompt: int,
    output: int,
    overhead_s: float,
    rate_per_load: float | None = None,
    requests: int | None = None,
) -> dict[str, Any]:
    """The planner's view of one search: the start (the first tier's predicted capacity), each tier's predicted
    capacity, and the probes, calls, requests and seconds the search takes if the model is right."""
    block = exp.search
    tiers = {name: parse_tier(texts) for name, texts in block.tiers.items()}
    log: list[float] = []
    probe = model_probe(timer, rs, exp, prompt, output, log, rate_per_load)
    # the model's own search from the lower bound finds the predicted capacities (its probes are not counted)
    # a replay's probe is its whole window (`requests`), whatever its statistics would ask
    over: dict[str, Any] = {"min_requests": requests} if requests else {}
    first = search(probe, tiers, spec_for(block, block.lower, bootstrap=50, bootstrap_pooled=20, **over))
    caps = {name: t.capacity for name, t in first.tiers.items()}
    start = next(iter(caps.values())) or block.load_value(block.lower)  # fails at lower: start there
    log.clear()
    run = search(probe, tiers, spec_for(block, start, bootstrap=50, bootstrap_pooled=20, **over))
    return {
        "start": block.start if block.start is not None else start,
        "predicted_capacity": caps,
        "probes": run.probes_used,
        "calls": run.calls,
        "requests": sum(p.result.n for p in run.probes),
        "grid_points": run.grid_points,
        "seconds": round(sum(log) + run.calls * overhead_s, 1),
    }


def print_search_plan(plan, console) -> None:
    """One row per search: the start, the predicted capacity per tier, probes against the grid, the time."""
    from rich.table import Table

    exp = plan.experiment
    t = Table(title=f"capacity searches ({exp.search.axis}; tiers: {', '.join(exp.search.tiers)})")
    for col in ("search", "start", "predicted capacity", "probes", "calls", "grid", "est."):
        t.add_column(col, justify="left" if col in ("search", "predicted capacity") else "right")
    for cp in plan.configs:
        for pp in cp.feasible_points:
            s = pp.search
            if not s:
                continue
            caps = ", ".join(
                f"{k} {'-' if v is None else f'{v:g}'}" for k, v in s["predicted_capacity"].items()
            )
            t.add_row(
                pp.id,
                f"{s['start']:g}",
                caps,
                str(s["probes"]),
                str(s["calls"]),
                str(s["grid_points"]),
                f"{s['seconds']:.0f}s",
            )
    console.print(t)
