"""Time to decision on the step model: the decision planner (matrix/decision.py) against the exhaustive answer.

The truth is the emulator's step model with each configuration's calibration perturbed (bandwidth, FLOP/s
efficiencies and the accept length times a seeded log-normal factor, `--model-error`): the planner's prior is the
unperturbed model, so its priors are wrong the way a real calibration is. On the truth the exhaustive answer is
computable (every concurrency of every cell, population values). Each seed then runs the decision procedure with
noisy per-request measurements drawn from the truth and compares its best configuration per (shape, tier) with the
exhaustive one. Times: the decision's GPU-hours and packed wall time on the experiment's hosts, against the grid
(serial, packed) and today's capacity search (one search per configuration × shape, serial, packed).

    .venv/bin/python bench/bench_decision.py [examples/qwen36-27b-rtxpro6000-decide.yaml] [--seeds 5] [--json]
    .venv/bin/python bench/bench_decision.py examples/qwen36-27b-a6000-tp2.yaml   # seed B: the decide block of
                                                            # --decide-from (default the seed-A decide example)

The step model's prediction error is reported before the fit (each probe's measured / predicted median) and after
it (the same probe against its configuration's fitted calibration from its *other* shapes' probes, as the decision
uses it for a shape it has not probed), with how often the fitted interval (± z sigma) holds the probe.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servesweep.config.experiment import load_experiment  # noqa: E402
from servesweep.config.search_block import SearchBlock  # noqa: E402
from servesweep.matrix import decision as D  # noqa: E402
from servesweep.matrix import planner  # noqa: E402
from servesweep.matrix.capacity_plan import price_search  # noqa: E402
from servesweep.matrix.decision_packed import SimulatedExecutor, run_decision_packed  # noqa: E402
from servesweep.matrix.placement import Job, schedule  # noqa: E402
from servesweep.matrix.timeline import attach_schedule  # noqa: E402
from servesweep.results.pergpu import flags_gpus  # noqa: E402
from servesweep.sglang.stepmodel import StepModel  # noqa: E402


def perturbed_timer(exp, err: float, seed: int):
    """timer_for: the planner's timer of a configuration with its calibration off by a seeded factor."""

    def make(cp):
        t = planner._Timer(cp.resolved, exp)
        rng = np.random.default_rng([seed, zlib.crc32(cp.config.id.encode())])
        f = np.exp(err * rng.standard_normal(4))
        cal = t.model.cal
        cal = replace(
            cal,
            bw_eff=min(0.99, cal.bw_eff * f[0]),
            flops_eff=min(0.99, cal.flops_eff * f[1]),
            decode_flops_eff=min(0.99, cal.decode_flops_eff * f[2]),
        )
        t.model = StepModel(cp.resolved, cal)
        if t.accept > 1.0:
            t.accept = max(1.0, t.accept * float(np.exp(0.5 * math.log(f[3]))))
        return t

    return make


def with_shape_error(cells, err: float, seed: int, ttft_per_prompt: bool = False):
    """Each cell's truth off by its own seeded factor on TTFT, TPOT and E2E (log-sd `err`): the part of the model's
    error one configuration's calibration cannot carry to its other shapes. `ttft_per_prompt`: the TTFT's factor
    is one per (configuration, workload, prompt length) instead, shared by its output lengths (a prompt's prefill
    does not know how long its answer will be); TPOT and E2E keep a factor per cell."""
    for c in cells:
        rng = np.random.default_rng([seed, 7, zlib.crc32("/".join(c.key).encode())])
        f = float(np.exp(err * rng.standard_normal()))
        ft = f
        if ttft_per_prompt:
            k = f"{c.config}/{c.shape.workload}-p{c.shape.prompt}"
            ft = float(np.exp(err * np.random.default_rng([seed, 8, zlib.crc32(k.encode())]).standard_normal()))
        base = c.predict

        def predict(load, base=base, f=f, ft=ft):
            p = dict(base(load))
            for m in ("ttft", "tpot", "e2e", "itl"):
                p[m] *= ft if m == "ttft" else f
            p["throughput"] /= f
            return p

        c.predict = predict
        c._cache.clear()
    return cells


def grid_answer(exp, truth_cells, noise):
    """The grid's answer with perfect measurements: capacity only at the grid's concurrencies."""
    out = {}
    grid = sorted(exp.load.concurrency)
    for name, texts in exp.decide.tiers.items():
        slos = D.parse_tier(list(texts))
        for c in truth_cells:
            cap = None
            for x in grid:
                if x > c.upper or not D.holds_population(slos, c.predicted(x), noise):
                    break
                cap = x
            v = 0.0 if cap is None else noise.throughput(c.predicted(cap), cap, c.shape.output) / c.gpus
            out.setdefault((c.shape.key, name), {})[c.config] = v
    return {q: (max(v, key=lambda k: v[k]) if max(v.values()) > 0 else None) for q, v in out.items()}


def capacity_search_cost(exp, plan, cells, hosts):
    """Today's capacity search with the decide tiers: one search per cell (matrix/capacity_plan.price_search)."""
    by_id = {cp.config.id: cp for cp in plan.configs}
    per_config: dict[str, float] = {}
    gpus = {}
    for c in cells:
        cp = by_id[c.config]
        block = SearchBlock(tiers=exp.decide.tiers, lower=c.lower, upper=c.upper, resolution="5%", max_time_s=1200)
        e = exp.model_copy(update={"search": block})
        s = price_search(e, cp.resolved, planner._Timer(cp.resolved, exp), c.shape.prompt, c.shape.output,
                         planner.POINT_OVERHEAD_S)
        per_config[c.config] = per_config.get(c.config, c.start_s) + s["seconds"]
        gpus[c.config] = c.gpus
    jobs = [Job(k, gpus[k], v) for k, v in per_config.items()]
    return {
        "serial_s": sum(per_config.values()),
        "gpu_s": sum(v * gpus[k] for k, v in per_config.items()),
        "packed_s": schedule(jobs, hosts).makespan_s,
    }


def _binding(cell, slos, noise, load):
    """The SLO of a tier closest to failing at a load on the truth: (signed distance past the threshold, text)."""
    p = cell.predicted(load)
    out = []
    for s in slos:
        q = float(s.stat[1:]) / 100.0 if s.stat else 0.5
        x = noise.quantile(s.metric, p[D.PER_METRIC[s.metric]], q)
        out.append(((x - s.value) / s.value * (1 if s.upper_limit else -1), s.text))
    return max(out)


def explain(miss, run, truth_cells, tier_texts, noise, tolerance=0.05) -> tuple[str, bool]:
    """Why a miss, and whether it is an SLO tie: the exhaustive best's and the decided configuration's true
    capacities, and how close their binding SLO sits to its threshold at the loads where a verdict flips (within
    `tolerance`: a tie of the SLO that no finite probe splits, the capacity being a cliff of one step there)."""
    shape, tier = miss["question"]
    slos = D.parse_tier(list(tier_texts[tier]))
    parts, tie = [], False
    for role in ("exhaustive", "decided"):
        name = miss[role]
        if name is None:
            continue
        cell = next(c for c in truth_cells if c.config == name and c.shape.key == shape)
        cap = D.capacity(cell, slos, noise)
        near = []
        for load in {cap or cell.lower, min(cell.upper, (cap or 0) + 1)}:
            d, text = _binding(cell, slos, noise, load)
            near.append(abs(d))
            parts.append(f"{role} {name} (true capacity {cap}): {text} {d:+.1%} at load {load}")
        tie = tie or min(near) <= tolerance
    return "; ".join(parts), tie


def fit_errors(
    run, cells, confidence: float, cell_sigma: float = D.CELL_SIGMA
) -> dict[str, list[tuple[float, float, float]]]:
    """Per metric, for every probe of a configuration with probes of other shapes of its prompt length: (log error
    before the fit, log error after it, the fit's sigma) where the fit is the configuration's calibration from
    those probes, as the decision fits and uses it (a prompt length it has not probed gets no fitted bounds)."""
    prompt_of = {c.shape.key: c.shape.prompt for c in cells}
    out: dict[str, list[tuple[float, float, float]]] = {m: [] for m in D.METRICS}
    for r in run.records:
        others = [x for x in run.records if x.config == r.config and x.shape != r.shape]
        if not others:
            continue
        fits = D.fit_calibration(r.config, others, group=prompt_of.get, cell_sigma=cell_sigma)
        fit = fits.get(prompt_of[r.shape])
        if fit is None:
            continue
        for m in D.METRICS:
            before = math.log(r.ratios[m])
            out[m].append((before, before - math.log(fit.ratios[m]), fit.sigma[m]))
    return out


def _error_line(errs, z: float) -> str:
    parts = []
    for m, rows in errs.items():
        if not rows:
            continue
        b, a, sig = (np.array(x) for x in zip(*rows, strict=True))
        cover = float(np.mean(np.abs(a) <= z * sig))
        parts.append(
            f"{m} before {np.exp(np.quantile(b, 0.025)):.3f}-{np.exp(np.quantile(b, 0.975)):.3f} (log-sd "
            f"{np.std(b):.3f}), after {np.exp(np.quantile(a, 0.025)):.3f}-{np.exp(np.quantile(a, 0.975)):.3f} "
            f"(log-sd {np.std(a):.3f}; the fit's ±{z:.2f} sigma holds {cover:.0%})"
        )
    return "; ".join(parts)


def packed(run, hosts) -> float:
    jobs = [Job(k, run.config_gpus[k], v) for k, v in run.config_seconds.items()]
    return schedule(jobs, hosts).makespan_s if jobs else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment", nargs="?", default=str(ROOT / "examples/qwen36-27b-rtxpro6000-decide.yaml"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--model-error", type=float, default=0.10, help="log-sd of each calibration factor")
    ap.add_argument("--shape-error", type=float, default=0.05, help="log-sd of each cell's own factor")
    ap.add_argument("--cell-sigma", type=float, default=D.CELL_SIGMA,
                    help="log-sd added to every fitted sigma for an unprobed cell's own error (0: the fit's alone)")
    ap.add_argument("--max-probe-time", type=float, default=None, help="seconds; default: the experiment's")
    ap.add_argument("--prior-margin", type=float, default=None, help="default: the experiment's")
    ap.add_argument("--unprobed-margin", type=float, default=None,
                    help="a configuration's bound before its first probe (inf: none; default: the experiment's)")
    ap.add_argument("--ablate", action="store_true", help="also run with each lever switched off")
    ap.add_argument("--guess-extend", type=float, default=1.0,
                    help="a probe whose verdict would be a guess at its cap goes on to this many times its requests")
    ap.add_argument("--check-guesses", type=float, default=1.0,
                    help="a guessed probe a settled answer leans on is extended to this many times its requests")
    ap.add_argument("--decide-from", default=str(ROOT / "examples/qwen36-27b-rtxpro6000-decide.yaml"),
                    help="an experiment without a decide block takes this one's (seed B)")
    ap.add_argument("--packed", action="store_true",
                    help="the decision as `servesweep run` packs it (matrix/decision_packed.py on virtual time): its "
                    "wall time is the packed figure; default: one probe at a time, its per-configuration time packed")
    ap.add_argument("--policy", default=None, choices=["greedy", "lookahead"],
                    help="with --packed: how lanes choose their probes (matrix/decision_packed.py; default: its own)")
    ap.add_argument("--ttft-error-per-prompt", action="store_true",
                    help="each cell's own TTFT error shared by the output lengths of its prompt (its prefill)")
    ap.add_argument("--no-share-one-user", action="store_true",
                    help="each output length's load-1 probe on its own stream (default: the experiment's setting)")
    ap.add_argument("--no-skip-first-round", action="store_true",
                    help="judge each probe's first round too (default: the experiment's setting)")
    ap.add_argument("--knee-margin", type=float, default=None,
                    help="loads searched up to this x the step model's throughput knee; 0: every load "
                    "(default: the experiment's)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    exp = load_experiment(a.experiment)
    if exp.decide is None:  # seed B: the question of --decide-from asked of this matrix
        exp = exp.model_copy(update={"decide": load_experiment(a.decide_from).decide})
    d = exp.decide
    if d is None:
        ap.error(f"{a.experiment}: no decide block, nor in {a.decide_from}")
    plan = planner.make_plan(exp)
    sched = attach_schedule(plan, a.experiment)
    hosts = list(sched.hosts)
    noise = D.Noise()
    prior = planner.decision_cells(plan)
    max_probe_s = a.max_probe_time if a.max_probe_time is not None else d.max_probe_time_s
    margin = a.prior_margin if a.prior_margin is not None else d.prior_margin
    grid = {
        "serial_s": plan.total_s,
        "packed_s": sched.makespan_s,
        "gpu_s": sum(cp.est_s * flags_gpus(cp.config.flags, exp.launcher.gpus) for cp in plan.configs),
    }
    search = capacity_search_cost(exp, plan, prior, hosts)
    rows = []
    for seed in range(a.seeds):
        truth = planner.decision_cells(plan, timer_for=perturbed_timer(exp, a.model_error, seed))
        if a.shape_error > 0:
            with_shape_error(truth, a.shape_error, seed, a.ttft_error_per_prompt)
        answer = D.exhaustive(truth, d.tiers, noise)
        kw = dict(confidence=d.confidence, resolution=d.resolution, max_requests=d.max_requests,
                  max_probe_s=max_probe_s, overhead_s=planner.decision_overhead_s(exp), noise=noise,
                  max_looks=d.max_looks, prior_margin=margin, guess_extend=a.guess_extend,
                  unprobed_margin=d.unprobed_margin if a.unprobed_margin is None else a.unprobed_margin,
                  check_guesses=a.check_guesses, cell_sigma=a.cell_sigma,
                  share_one_user=d.share_one_user and not a.no_share_one_user,
                  skip_first_round=d.skip_first_round and not a.no_skip_first_round,
                  knee_margin=d.knee_margin if a.knee_margin is None else (a.knee_margin or None))
        measure = D.simulated_measure(noise, {c.key: c.predicted for c in truth}, seed)
        if a.packed:
            stop_s = {cp.config.id: cp.stop_s for cp in plan.configs}
            pkw = {k: v for k, v in kw.items() if k != "check_guesses"}
            if a.policy:
                pkw["policy"] = a.policy
            pk = run_decision_packed(prior, d.tiers, measure, hosts, SimulatedExecutor(stop_s), **pkw)
            run, wall = pk.run, pk.wall_s
            half = run_decision_packed(
                prior, d.tiers, measure, hosts, SimulatedExecutor(stop_s), budget_s=wall / 2, **pkw
            ).run
        else:
            run = D.run_decision(prior, d.tiers, measure, **kw)
            wall = packed(run, hosts)
        agree = D.agreement(run.answer.best(), answer, d.resolution)
        gpu_s = run.as_dict()["gpu_seconds"]
        if not a.packed:
            half = D.run_decision(prior, d.tiers, measure, budget_gpu_s=gpu_s / 2, **kw)
        half_label = half.answer.label
        half_agree = D.agreement(half.answer.best(), answer, d.resolution)
        grid_agree = D.agreement(grid_answer(exp, truth, noise), answer, d.resolution)
        on_guess = {(q.shape, q.tier) for q in run.answer.questions if q.guessed}
        for m in agree["misses"]:
            m["why"], m["slo_tie"] = explain(m, run, truth, d.tiers, noise)
            m["on_guess"] = m["question"] in on_guess
        agree["explained"] = (agree["questions"] * agree["exact"] + sum(
            1 for m in agree["misses"] if m["within_resolution"] or m["slo_tie"])) / max(1, agree["questions"])
        ratios = {m: [r.ratios[m] for r in run.records] for m in ("ttft", "tpot", "e2e")}
        errors = fit_errors(run, prior, d.confidence, a.cell_sigma)
        ablation = {}
        if a.ablate:
            for name, over in (("no racing", {"race": False}), ("no sequential looks (one look)", {"max_looks": 1}),
                               ("no prior bound", {"use_prior": False}),
                               ("no fitted calibration (prior bounds: the margin, shrunk with probes)",
                                {"fit_prior": False}),
                               ("no fitted calibration, no calibrated margin (the step model's, fixed margin)",
                                {"fit_prior": False, "calibrate_prior": False})):
                alt = D.run_decision(prior, d.tiers, measure, **{**kw, **over})
                ablation[name] = {
                    "gpu_s": alt.as_dict()["gpu_seconds"],
                    "within_resolution": D.agreement(alt.answer.best(), answer, d.resolution)["within_resolution"],
                }
        rows.append({
            "ratios": ratios,
            "fit_errors": errors,
            "ablation": ablation,
            "seed": seed,
            "probes": len(run.records),
            "requests": sum(r.requests for r in run.records),
            "gpu_s": gpu_s,
            "packed_s": wall,
            "serial_s": sum(run.config_seconds.values()),
            "counts": run.answer.counts(),
            "on_guess": len(on_guess),
            "agreement": agree,
            "half_budget": {"label": half_label, "agreement": half_agree},
            "grid_agreement": grid_agree,
        })
    out = {
        "experiment": exp.name,
        "seeds": a.seeds,
        "model_error": a.model_error,
        "shape_error": a.shape_error,
        "cell_sigma": a.cell_sigma,
        "share_one_user": d.share_one_user and not a.no_share_one_user,
        "skip_first_round": d.skip_first_round and not a.no_skip_first_round,
        "knee_margin": d.knee_margin if a.knee_margin is None else (a.knee_margin or None),
        "max_probe_s": max_probe_s,
        "prior_margin": margin,
        "unprobed_margin": d.unprobed_margin if a.unprobed_margin is None else a.unprobed_margin,
        "noise": D.Noise().__dict__,
        "questions": rows[0]["agreement"]["questions"] if rows else 0,
        "grid": grid,
        "capacity_search": search,
        "runs": rows,
        "bench_s": round(time.monotonic() - t0, 1),
    }
    if a.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    h = 3600.0

    def mean(k, f=lambda r, k: r[k]):
        return float(np.mean([f(r, k) for r in rows]))

    print(f"{exp.name}: {out['questions']} questions, {a.seeds} seeds, model error {a.model_error:.0%} "
          f"per configuration + {a.shape_error:.0%} per cell, "
          f"max probe {max_probe_s:g}s, prior margin {margin:g}, bench {out['bench_s']}s")
    print(f"| method | GPU-h | serial h | packed h ({sum(h.gpus for h in hosts)} GPUs) | agreement exact | within resolution | + SLO ties |")
    print("|---|---|---|---|---|---|---|")
    g_ex = mean("", lambda r, k: r["grid_agreement"]["exact"])
    g_in = mean("", lambda r, k: r["grid_agreement"]["within_resolution"])
    print(f"| grid (32 requests/point, perfect measurement) | {grid['gpu_s'] / h:.1f} | {grid['serial_s'] / h:.2f} | "
          f"{grid['packed_s'] / h:.2f} | {g_ex:.1%} | {g_in:.1%} | - |")
    print(f"| capacity search per cell (today) | {search['gpu_s'] / h:.1f} | {search['serial_s'] / h:.2f} | "
          f"{search['packed_s'] / h:.2f} | - | - | - |")
    ex = mean("", lambda r, k: r["agreement"]["exact"])
    wi = mean("", lambda r, k: r["agreement"]["within_resolution"])
    print(f"| decision (racing + sequential) | {mean('gpu_s') / h:.1f} | {mean('serial_s') / h:.2f} | "
          f"{mean('packed_s') / h:.2f} | {ex:.1%} | {wi:.1%} | "
          f"{mean('', lambda r, k: r['agreement']['explained']):.1%} |")
    hx = mean("", lambda r, k: r["half_budget"]["agreement"]["exact"])
    hw = mean("", lambda r, k: r["half_budget"]["agreement"]["within_resolution"])
    print(f"| decision stopped at half its GPU time (anytime) | {mean('gpu_s') / 2 / h:.1f} | - | - | {hx:.1%} | "
          f"{hw:.1%} | - |")
    if a.ablate:
        print("| lever switched off | GPU-h | within resolution |")
        print("|---|---|---|")
        for name in rows[0]["ablation"]:
            print(f"| {name} | {np.mean([r['ablation'][name]['gpu_s'] for r in rows]) / h:.1f} | "
                  f"{np.mean([r['ablation'][name]['within_resolution'] for r in rows]):.1%} |")
    allr = {m: np.concatenate([r["ratios"][m] for r in rows]) for m in ("ttft", "tpot", "e2e")}
    print("step model's prediction error (measured median / predicted, over every probe): " + "; ".join(
        f"{m} {np.exp(np.mean(np.log(v))):.3f} (95 % of probes in {np.quantile(v, 0.025):.3f}-"
        f"{np.quantile(v, 0.975):.3f})" for m, v in allr.items()))
    errs = {m: [x for r in rows for x in r["fit_errors"][m]] for m in D.METRICS}
    print("prediction error of a probe's median, 95 % of probes (measured / predicted), before the fit and after "
          "its configuration's fit from its other shapes of that prompt length: "
          + (_error_line(errs, D._z(1 - d.confidence)) or "no configuration probed two shapes of one prompt length"))
    wrong = [m for r in rows for m in r["agreement"]["misses"] if not m["within_resolution"]]
    print(f"answers resting on a point estimate at a probe's cap: {sum(r['on_guess'] for r in rows)} of "
          f"{out['questions'] * len(rows)}; of the {len(wrong)} answers off by more than the resolution, "
          f"{sum(m['on_guess'] for m in wrong)} are among them")
    for r in rows:
        print(f"seed {r['seed']}: {r['probes']} probes, {r['requests']} requests, {r['counts']}; misses:")
        for m in r["agreement"]["misses"]:
            print(f"  {m['question']}: decided {m['decided']} ({m['decided_value']}) vs {m['exhaustive']} "
                  f"({m['best_value']}){' tie within resolution' if m['within_resolution'] else ''}"
                  f"{' SLO tie' if m['slo_tie'] else ''}{' (on a guess)' if m['on_guess'] else ''}; {m['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
