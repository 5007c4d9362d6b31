"""Fit calibration constants to measured throughput points, in simulated time.

A measured point is a closed-loop benchmark: `concurrency` clients, fixed prompt and output lengths (ignore_eos), and
the aggregate output tokens/s it reached. The fit runs the engine on the same workload and minimises the squared
relative errors over the chosen constants (Nelder-Mead in log space, so constants stay positive). See
docs/emulator.md "Calibrating to a new GPU".

    python -m servesweep.sim.engine_fit --model-path Qwen/Qwen3.6-27B --tp 2 --sim-gpu a6000 \
        --speculative-algorithm NEXTN --point 1:1000:500:73.5 --point 2:1000:500:137.7 --point 4:1000:500:207.1 \
        --fit bw_eff,spec_accept_mean,gdn_token_s
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.sglang.serverargs import ResolvedServer, resolve_server
from servesweep.sim.engine import simulate_closed_loop


@dataclass(frozen=True, slots=True)
class Point:
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    output_throughput: float  # aggregate output tok/s measured

    @classmethod
    def parse(cls, text: str) -> Point:
        try:
            c, p, o, t = text.split(":")
            return cls(int(c), int(p), int(o), float(t))
        except ValueError:
            raise ValueError(
                f"--point {text!r}: expected CONCURRENCY:PROMPT_TOKENS:OUTPUT_TOKENS:OUTPUT_TOK_PER_S"
            ) from None


def predict(
    resolved: ResolvedServer, points: Sequence[Point], calibration: Mapping[str, Any], *, rounds: int = 3
) -> list[float]:
    """Aggregate output tok/s the engine predicts for each point (rounds x concurrency requests per point)."""
    out = []
    for p in points:
        r = simulate_closed_loop(
            resolved,
            concurrency=p.concurrency,
            prompt_tokens=p.prompt_tokens,
            output_tokens=p.output_tokens,
            num_requests=rounds * p.concurrency,
            calibration=calibration,
        )
        out.append(r["output_throughput"])
    return out


def _nelder_mead(f: Callable[[list[float]], float], x0: list[float], step: float = 0.15, iters: int = 300):
    n = len(x0)
    simplex = [list(x0)]
    for i in range(n):
        x = list(x0)
        x[i] += step
        simplex.append(x)
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if vals[-1] - vals[0] < 1e-10:
            break
        centroid = [sum(simplex[i][j] for i in range(n)) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(exp)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (x - b) for b, x in zip(best, s, strict=True)] for s in simplex[1:]
                ]
                vals = [vals[0]] + [f(x) for x in simplex[1:]]
    i = min(range(n + 1), key=lambda i: vals[i])
    return simplex[i], vals[i]


def fit(
    resolved: ResolvedServer,
    points: Sequence[Point],
    keys: Sequence[str],
    *,
    start: Mapping[str, float] | None = None,
    fixed: Mapping[str, float] | None = None,
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Fit `keys` (Calibration field names) so predictions match `points`; returns constants, predictions, errors."""
    from servesweep.sglang.stepmodel import calibration_for

    base = calibration_for(resolved, dict(fixed or {})).as_dict()
    base.update(fixed or {})
    x0 = []
    for k in keys:
        v = float((start or {}).get(k, base[k]))
        if v <= 0:
            v = {"spec_accept_mean": 2.5}.get(k, 1e-6)
        x0.append(math.log(v))
    bounds = dict(bounds or {})
    if "spec_accept_mean" in keys and "spec_accept_mean" not in bounds:
        bounds["spec_accept_mean"] = (1.0, 1.0 + float(resolved.spec_num_steps or 1))

    def consts(x: list[float]) -> dict[str, float]:
        c = dict(fixed or {})
        for k, v in zip(keys, x, strict=True):
            val = math.exp(v)
            if k in bounds:
                lo, hi = bounds[k]
                val = min(max(val, lo), hi)
            c[k] = val
        return c

    def loss(x: list[float]) -> float:
        pred = predict(resolved, points, consts(x))
        return sum(
            ((p - m.output_throughput) / m.output_throughput) ** 2 for p, m in zip(pred, points, strict=True)
        )

    best, _ = _nelder_mead(loss, x0)
    c = consts(best)
    pred = predict(resolved, points, c)
    return {
        "calibration": c,
        "points": [
            {
                "concurrency": m.concurrency,
                "prompt_tokens": m.prompt_tokens,
                "output_tokens": m.output_tokens,
                "measured": m.output_throughput,
                "predicted": round(p, 2),
                "error_pct": round(100 * (p - m.output_throughput) / m.output_throughput, 2),
            }
            for p, m in zip(pred, points, strict=True)
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m servesweep.sim.engine_fit", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--tp-size", "--tp", type=int, default=1, dest="tp_size")
    ap.add_argument("--sim-gpu", default="H200")
    ap.add_argument("--speculative-algorithm", default=None)
    ap.add_argument("--speculative-num-steps", type=int, default=None)
    ap.add_argument("--max-running-requests", type=int, default=None)
    ap.add_argument(
        "--point", action="append", required=True, type=Point.parse, help="C:PROMPT:OUTPUT:TOK_PER_S"
    )
    ap.add_argument("--fit", default="bw_eff,spec_accept_mean,gdn_token_s", help="comma-separated constants")
    ap.add_argument("--fixed", default="", help="key=value,... held constant")
    ns = ap.parse_args(argv)
    args = {
        "model_path": ns.model_path,
        "tp_size": ns.tp_size,
        "sim_gpu": ns.sim_gpu,
        "speculative_algorithm": ns.speculative_algorithm,
        "speculative_num_steps": ns.speculative_num_steps,
        "max_running_requests": ns.max_running_requests,
    }
    resolved = resolve_server(args)
    fixed = {}
    for item in filter(None, ns.fixed.split(",")):
        k, _, v = item.partition("=")
        fixed[k.strip()] = float(v)
    result = fit(resolved, ns.point, [k.strip() for k in ns.fit.split(",") if k.strip()], fixed=fixed)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
