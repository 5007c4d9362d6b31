"""The decision run on the emulator against the exhaustive answer of the same emulator (issue 33's done-when).

`servesweep run` executes a cut of `examples/qwen36-27b-rtxpro6000-decide.yaml`'s decision against the emulator,
time-accelerated: every configuration's emulator runs with a seeded calibration error (bandwidth, FLOP/s
efficiencies and accept length off by a log-normal factor, log-sd `--model-error`, as bench/bench_decision.py's
truth) and `speedup=S`; the decide tiers are scaled to the speed-up (latencies / S, rates × S) and so is
`max_probe_time`. The planner's priors stay the unperturbed step model (the child process that runs `servesweep run`
hides the error keys of `--sim-calibration` from `planner.sim_calibration`, the speed-up only is seen), so the priors
are wrong the way a real calibration is.

The exhaustive answer is the emulator's own engine (sim/engine.py `Engine` in virtual time, the code that times the
HTTP emulator's steps) with the same perturbed calibration: every cell's closed loop at each concurrency the capacity
bisection asks for, its per-request TTFT, TPOT and E2E, the tier's percentiles on them, the capacity (largest
concurrency holding the tier) and its output tok/s per GPU. Not the planner's analytic closed-loop formula with
matrix/decision.py's `Noise`: that is the prior's approximation of the engine, not the engine (chunked-prefill
interleaving, the batch's phases, the KV pool), and the run measures the engine.

Then a real-timing slice (probes of the run on 3k/256 repeated at speed-up 1: accelerated × S against real for TTFT,
TPOT and throughput, bootstrap intervals) and the same run with budget.wall_time at half its measured time (exit 2,
decision.json labelled best so far, its agreement).

    .venv/bin/python bench/bench_decision_run.py [--speedup 20] [--seed 0] [--out /tmp/bdr] [--skip-real]
    [--truth-only: the exhaustive answer only, kept in --out for the run that follows]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servesweep.config.experiment import load_experiment  # noqa: E402
from servesweep.matrix import decision as D  # noqa: E402
from servesweep.matrix import planner  # noqa: E402

HIDDEN = ("bw_eff", "flops_eff", "decode_flops_eff", "spec_accept_mean")  # the error the priors do not see
# an agent turn's tokens besides the answer and the tool result (the chat template around the two messages): on the
# emulator a 3k/256 session's prompts grow by 2,270 tokens a turn with 2,000-token tool results (3,005, 5,275, ...)
TURN_TEMPLATE = 14


# ---------------------------------------------------------------- the cut experiment


def perturbation(cid: str, rs, exp, err: float, seed: int) -> dict[str, float]:
    """A configuration's emulator calibration off by seeded factors (bench/bench_decision.py's perturbed_timer)."""
    from servesweep.sglang.stepmodel import calibration_for

    cal = calibration_for(rs, None)
    rng = np.random.default_rng([seed, zlib.crc32(cid.encode())])
    f = np.exp(err * rng.standard_normal(4))
    out = {
        "bw_eff": min(0.99, cal.bw_eff * f[0]),
        "flops_eff": min(0.99, cal.flops_eff * f[1]),
        "decode_flops_eff": min(0.99, cal.decode_flops_eff * f[2]),
    }
    accept = planner._Timer(rs, exp).accept
    if accept > 1.0:
        out["spec_accept_mean"] = max(1.0, accept * float(np.exp(0.5 * math.log(f[3]))))
    return {k: round(float(v), 4) for k, v in out.items()}


def cut_experiment(
    a, workdir: Path, *, speedup: float, budget_s: float | None, name: str
) -> tuple[dict, dict]:
    """The cut of the decide example as an experiment dict for the emulator here, and each configuration's hidden
    calibration {config id: {key: value}}."""
    src = yaml.safe_load(Path(a.experiment).read_text())
    base_exp = load_experiment(a.experiment)
    bundles = {b["name"]: b.get("flags") or {} for b in src["server"]["bundles"]}
    d: dict[str, Any] = {k: v for k, v in src.items() if k not in ("slo", "exclude", "budget")}
    d["name"] = name
    d["target"] = {"inventory": "local", "port": 0}
    d["answers"] = {"needle_probes": False}
    d["launcher"] = {
        **src["launcher"],
        "workdir": str(workdir / "srv"),
        "startup_timeout_s": 120,
        "stop_timeout_s": 20,
        "sim_args": {"sim_load_time": 0.3},
    }
    new_bundles = []
    for tp in a.tp:
        for b in a.bundles:
            new_bundles.append({"name": f"tp{tp}-{b}", "flags": {**bundles[b], "tp_size": tp}})
    d["server"] = {"base": src["server"]["base"], "bundles": new_bundles}
    load = dict(src["load"])
    load.update(prompt_tokens=a.prompts, output_tokens=a.outputs)
    d["exclude"] = []
    if a.agent:  # the example's agent sessions, at the shapes the example asks them for (its excludes)
        load["workload"] = ["single", "agent"]
        for ex in src.get("exclude") or []:
            if ex.get("workload") != "agent":
                continue
            kept = {k: [x for x in v if x in (a.prompts if k == "prompt_tokens" else a.outputs)]
                    for k, v in ex.items() if k != "workload"}  # fmt: skip
            if all(kept.values()):
                d["exclude"].append({"workload": "agent", **kept})
    else:
        load.pop("workloads", None)
        load["workload"] = ["single"]
    d["load"] = load
    if 100000 in a.prompts:
        d["exclude"].append({"prompt_tokens": 100000, "concurrency": [16, 32, 64, 100]})
    dec = dict(src["decide"])
    from servesweep.config.search_block import SearchBlock

    dec["tiers"] = SearchBlock.scaled_tiers(base_exp.decide, speedup)  # type: ignore[arg-type]
    dec["max_probe_time"] = f"{base_exp.decide.max_probe_time_s / speedup:g}s"  # type: ignore[union-attr]
    d["decide"] = dec
    if budget_s:
        d["budget"] = {"wall_time": f"{budget_s:g}s"}
    # each configuration's hidden calibration: the plan resolves the servers (config ids s01-...)
    d_plan = json.loads(json.dumps(d))
    exp = _validate(d_plan)
    plan = planner.make_plan(exp)
    hidden = {}
    by_bundle = {cp.config.id.split("-", 1)[1]: cp for cp in plan.configs}  # s03-tp1-ddtree32: not in order
    for b in new_bundles:
        cp = by_bundle[b["name"]]
        h = perturbation(cp.config.id, cp.resolved, exp, a.model_error, a.seed)
        hidden[cp.config.id] = h
        cal = ",".join(f"{k}={v}" for k, v in h.items())
        b["flags"]["sim_calibration"] = f"{cal},speedup={speedup:g}"
    return d, hidden


def _validate(d: dict):
    from servesweep.config.experiment import Experiment

    return Experiment.model_validate(d)


# ---------------------------------------------------------------- the exhaustive answer: the engine itself


def engine_samples(
    rs, cal: dict, prompt: int, output: int, conc: int, seed: int, agent: tuple[int, int, int] | None = None
) -> dict[str, np.ndarray]:
    """A closed loop of `conc` users on the emulator's engine in virtual time: per-request TTFT, TPOT, E2E (s) of
    the requests after the first round (the start's burst of prefills is the warm-up). `agent`: the users run
    agent sessions instead (`agent_samples`)."""
    from servesweep.sim.engine import Engine, EngineRequest

    if agent is not None:
        return agent_samples(rs, cal, prompt, output, conc, seed, agent)
    eng = Engine(rs, seed=seed, calibration=cal)
    total = conc + max(4 * conc, 200)
    sent = 0
    done: list = []

    def make():
        nonlocal sent
        sent += 1
        # ids of this request alone (no prefix shared with another: a cache hit would be a different question);
        # a range, not random draws: 100k randrange calls per request were 86 % of a 100k-prompt loop's time
        base = sent * (prompt + 1)
        ids = list(range(base, base + prompt))
        return EngineRequest(f"r{sent}", ids, output, on_emit, ignore_eos=True)

    def on_emit(req, n, finished):
        if finished:
            done.append(req)
            if sent < total:
                eng.submit(make())

    eng.run_simulated([make() for _ in range(conc)])
    return _samples(done[conc:])


def _samples(done: list) -> dict[str, np.ndarray]:
    """Finished engine requests as per-request TTFT, TPOT and E2E (s)."""
    rows = [r for r in done if r.first_token_time is not None and r.finish_time is not None]
    ttft = np.array([r.first_token_time - r.queue_start for r in rows])
    e2e = np.array([r.finish_time - r.queue_start for r in rows])
    tpot = (e2e - ttft) / np.maximum(1, np.array([r.completion_tokens for r in rows]) - 1)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def agent_samples(
    rs, cal: dict, prompt: int, output: int, conc: int, seed: int, agent: tuple[int, int, int]
) -> dict[str, np.ndarray]:
    """`conc` users each running agent sessions one after another on the engine in virtual time (workload/build.py's
    `AgentSession` as the emulator sees it): a session's first turn is `prompt` tokens, its first `shared` the tools
    description every session shares; each later turn is the last turn's prompt plus the answer, a tool result of
    `tool` tokens and the template's tokens around them (`TURN_TEMPLATE`), new ids (the emulator caches prompts,
    and the answer comes back as text, tokenized anew), so the radix cache serves the last prompt and the shared
    tools. Per-turn TTFT,
    TPOT, E2E (s) of every turn after each user's first session (the start's burst of first turns is the warm-up),
    at least max(200, 4 x conc) turns."""
    from servesweep.sim.engine import Engine, EngineRequest

    turns, tool, shared = agent
    eng = Engine(rs, seed=seed, calibration=cal)
    sessions = 1 + max(1, math.ceil(max(200, 4 * conc) / (conc * turns)))  # per user, the first one the warm-up
    shared_ids = list(range(shared))
    top = [shared]  # the next fresh token id: ids of their own, no prefix shared but the tools'

    def fresh(n: int) -> list[int]:
        top[0] += n
        return list(range(top[0] - n, top[0]))

    state: dict[str, tuple[int, int, int, list[int]]] = {}  # rid -> (user, session, turn, prompt ids)
    done: list = []

    def send(user: int, session: int, turn: int, ids: list[int]):
        rid = f"u{user}-s{session}-t{turn}"
        state[rid] = (user, session, turn, ids)
        return EngineRequest(rid, ids, output, on_emit, ignore_eos=True)

    def first(user: int, session: int):
        return send(user, session, 1, shared_ids + fresh(prompt - shared))

    def on_emit(req, n, finished):
        if not finished:
            return
        user, session, turn, ids = state.pop(req.rid)
        if session > 0:
            done.append(req)
        if turn < turns:
            eng.submit(send(user, session, turn + 1, ids + fresh(output + tool + TURN_TEMPLATE)))
        elif session + 1 < sessions:
            eng.submit(first(user, session + 1))

    eng.run_simulated([first(u, 0) for u in range(conc)])
    return _samples(done)


def slo_statistic(x, s: dict[str, np.ndarray]) -> float:
    """An SLO's statistic (its percentile; decode tok/s or ms) over engine samples (seconds)."""
    q = float(x.stat[1:]) if x.stat else 50.0
    if x.metric == "decode_tokens_per_s":
        return float(np.percentile(1.0 / s["tpot"], q))
    return 1000.0 * float(np.percentile(s[x.metric], q))


def holds(slos, s: dict[str, np.ndarray]) -> bool:
    return all(x.holds(slo_statistic(x, s)) for x in slos)


def cell_truth(
    rs, cal: dict, prompt: int, output: int, lower: int, upper: int, tiers: dict, seed: int, gpus: int,
    agent: tuple[int, int, int] | None = None,
) -> tuple[dict, dict]:  # fmt: skip
    """One cell's ({tier: capacity}, {tier: tok/s per GPU at it}) on the engine: bisection over [lower, upper] (a
    tier's verdict falls with concurrency), each concurrency's closed loop simulated once and shared by the tiers."""
    cache: dict[int, dict[str, np.ndarray]] = {}

    def at(load: int) -> dict[str, np.ndarray]:
        if load not in cache:
            cache[load] = engine_samples(rs, cal, prompt, output, load, seed, agent)
        return cache[load]

    caps: dict = {}
    values: dict = {}
    for name, texts in tiers.items():
        slos = D.parse_tier(list(texts))
        if not holds(slos, at(lower)):
            cap = None
        elif holds(slos, at(upper)):
            cap = upper
        else:
            lo, hi = lower, upper  # holds at lo, fails at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if holds(slos, at(mid)) else (lo, mid)
            cap = lo
        caps[name] = cap
        values[name] = 0.0 if cap is None else cap * output / float(np.mean(at(cap)["e2e"])) / gpus
    return caps, values


def agent_sessions(cp, shape) -> tuple[int, int, int] | None:
    """(turns, tool-result tokens, shared tools tokens) of an agent shape's sessions as its points ask for them
    (the tools description's length as workload/build.py builds it); None for single-shot."""
    from servesweep.workload.build import agent_shared_tokens

    if shape.kind != "agent":
        return None
    for pp in cp.feasible_points:
        pt = pp.point
        if (pp.workload, pt.prompt_tokens, pt.output_tokens) == (shape.workload, shape.prompt, shape.output):
            return int(pt.session_turns), int(pt.tool_result_tokens), agent_shared_tokens(pt)
    raise KeyError(f"no point of {cp.config.id} at {shape.key}")


def engine_truth(
    exp, hidden: dict, tiers: dict, seed: int, jobs: int = 1, kinds: tuple[str, ...] | None = None
) -> tuple[dict, dict]:
    """{(shape, tier): {config: tok/s per GPU at its capacity}} and {(config, shape, tier): capacity} on the engine
    at real speed (the unscaled tiers), each cell by `cell_truth`, `jobs` cells at a time (processes); `kinds`:
    only the cells whose workload is one of them (single-shot "synthetic", "agent")."""
    from concurrent.futures import ProcessPoolExecutor

    plan = planner.make_plan(exp)
    by_id = {cp.config.id: cp for cp in plan.configs}
    cells = [c for c in planner.decision_cells(plan) if kinds is None or c.shape.kind in kinds]
    args = [
        (by_id[c.config].resolved, hidden[c.config], c.shape.prompt, c.shape.output, c.lower, c.upper,
         dict(tiers), seed, c.gpus, agent_sessions(by_id[c.config], c.shape))
        for c in cells
    ]  # fmt: skip
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(cell_truth, *zip(*args, strict=True)))
    else:
        results = [cell_truth(*a) for a in args]
    values: dict = {}
    caps: dict = {}
    for c, (cell_caps, cell_values) in zip(cells, results, strict=True):
        for name in tiers:
            caps[(c.config, c.shape.key, name)] = cell_caps[name]
            values.setdefault((c.shape.key, name), {})[c.config] = cell_values[name]
    return values, caps


def binding_on_engine(
    rs, cal: dict, prompt: int, output: int, load: int, slos, seed: int, agent: tuple[int, int, int] | None = None
) -> tuple[float, str]:
    """The SLO of a tier closest to failing at a load on the engine: (signed distance past its threshold, its
    text); > 0 fails, < 0 holds (bench/bench_decision.py's `_binding` on the engine's samples)."""
    s = engine_samples(rs, cal, prompt, output, load, seed, agent)
    return max(
        ((slo_statistic(x, s) - x.value) / x.value * (1 if x.upper_limit else -1), x.text) for x in slos
    )


def explain_on_engine(
    misses: list[dict], exp, hidden: dict, tiers: dict, caps: dict, seed: int, probed: set[tuple[str, str]],
    tolerance: float = 0.05,
) -> None:  # fmt: skip
    """Each miss's cause on the engine, in place: `engine` (the exhaustive best's and the decided configuration's
    binding SLO at the loads where their verdict flips), `slo_tie` (one of them within `tolerance` of its
    threshold there: a cliff no 1-minute probe splits, bench_decision's SLO tie) and `unprobed` (the exhaustive
    best's cell was never probed: dropped on its prior, or on its calibration from other shapes)."""
    plan = planner.make_plan(exp)
    by_id = {cp.config.id: cp for cp in plan.configs}
    cell_of = {(c.config, c.shape.key): c for c in planner.decision_cells(plan)}
    for m in misses:
        shape, tier = m["question"]
        slos = D.parse_tier(list(tiers[tier]))
        parts, tie = [], False
        for role in ("exhaustive", "decided"):
            name = m[role]
            if name is None:
                continue
            c = cell_of[(name, shape)]
            cap = caps.get((name, shape, tier))
            near = []
            for load in sorted({cap or c.lower, min(c.upper, (cap or 0) + 1)}):
                d, text = binding_on_engine(
                    by_id[name].resolved, hidden[name], c.shape.prompt, c.shape.output, load, slos, seed,
                    agent_sessions(by_id[name], c.shape),
                )
                near.append(abs(d))
                parts.append(f"{role} {name} (engine capacity {cap}): {text} {d:+.1%} at load {load}")
            tie = tie or min(near) <= tolerance
        m["engine"] = "; ".join(parts)
        m["slo_tie"] = tie
        m["unprobed"] = m["exhaustive"] is not None and (m["exhaustive"], shape) not in probed


def model_against_engine(exp, truth: dict, tiers: dict) -> dict[str, Any]:
    """The step model's value of every (cell, tier) against the engine's (both > 0): the ratio engine / model,
    with each configuration's hidden calibration given to the model and blind to it as the run's planner is
    (`child_run`); geometric mean and log-sd over the cells, and per configuration the blind geometric mean."""
    parsed = {k: D.parse_tier(list(v)) for k, v in tiers.items()}
    original = planner.sim_calibration
    out: dict[str, Any] = {}
    for label in ("given", "blind"):
        if label == "blind":
            planner.sim_calibration = blind_calibration(original)  # type: ignore[assignment]
        try:
            cells = planner.decision_cells(planner.make_plan(exp))
        finally:
            planner.sim_calibration = original  # type: ignore[assignment]
        model = D.prior_bounds(cells, parsed, D.Noise(), 1.0)
        logs: dict[str, list[float]] = {}
        for (key, tier), v in model.items():
            t = truth[(key[1], tier)][key[0]]
            if v > 0 and t > 0:
                logs.setdefault(key[0], []).append(math.log(t / v))
        every = [x for xs in logs.values() for x in xs]
        out[label] = {
            "n": len(every),
            "ratio": float(np.exp(np.mean(every))),
            "log_sd": float(np.std(every)),
            "per_config": {k: round(float(np.exp(np.mean(xs))), 3) for k, xs in sorted(logs.items())},
        }
    return out


def explained_share(agree: dict) -> float:
    """Agreement with the misses explained: exact, ties within resolution, SLO ties (not where the exhaustive best's
    cell was never probed: then a prior dropped it, whatever its SLO's cliff)."""
    n = max(1, agree["questions"])
    return agree["within_resolution"] + sum(
        1 for m in agree["misses"] if not m["within_resolution"] and m.get("slo_tie") and not m.get("unprobed")
    ) / n


# ---------------------------------------------------------------- the run


def blind_calibration(original):
    """planner.sim_calibration without the hidden keys: the priors the run's planner sees (the unperturbed step
    model at the emulator's speed-up)."""

    def seen(exp, cfg):
        got = original(exp, cfg)
        return None if got is None else {k: v for k, v in got.items() if k not in HIDDEN}

    return seen


def child_run(argv: list[str]) -> int:
    """`servesweep run ARGV` with the planner blind to the hidden calibration keys (`blind_calibration`)."""
    planner.sim_calibration = blind_calibration(planner.sim_calibration)  # type: ignore[assignment]
    from servesweep.cli import main

    try:
        main(argv, prog_name="servesweep")
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def run_servesweep(args: list[str], log: Path, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, __file__, "--child", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
    return rc, time.monotonic() - t0


def decided(doc: dict) -> dict:
    return {(q["shape"], q["tier"]): q["best"] for q in doc["questions"]}


def agreement_of(doc: dict, truth: dict, resolution: float, caps: dict, tiers: dict) -> dict:
    got = decided(doc)
    agree = D.agreement(got, truth, resolution)
    by_q = {(q["shape"], q["tier"]): q for q in doc["questions"]}
    for m in agree["misses"]:
        q = by_q[m["question"]]
        shape, tier = m["question"]
        vals = truth[m["question"]]
        m["state"] = q["state"]
        m["why"] = (
            f"run: {q['state']} {q['best']} (bracket {q['value'] and q['value']['bracket']}, "
            f"{q['value'] and q['value']['estimate']} tok/s/GPU accelerated); engine: {m['exhaustive']} "
            f"capacity {caps.get((m['exhaustive'], shape, tier))}, {m['decided']} capacity "
            f"{caps.get((m['decided'], shape, tier))}; values "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(vals.items(), key=lambda kv: -kv[1])[:3])
        )
    ties = sum(1 for q in doc["questions"] if q["state"] == "tie")
    agree["ties"] = ties
    return agree


# ---------------------------------------------------------------- the real-timing slice


def probe_samples(run_dir: Path, points: list[str]) -> dict[str, np.ndarray]:
    from servesweep.matrix.capacity_search import ProbeResult
    from servesweep.results.records import read_parquet

    parts = [ProbeResult.from_records(read_parquet(run_dir / p / "records.parquet")) for p in points]
    ok = np.concatenate([x.ok for x in parts])
    return {
        m: np.concatenate([getattr(x, f"{m}_ms") for x in parts])[ok] / 1000.0
        for m in ("ttft", "tpot", "e2e")
    }


def ratio_interval(acc: np.ndarray, real: np.ndarray, stat, rng, n: int = 2000) -> tuple[float, float, float]:
    """stat(acc) / stat(real) with a percentile-bootstrap 95 % interval (requests resampled on each side)."""
    est = stat(acc) / stat(real)
    bs = [stat(rng.choice(acc, acc.size)) / stat(rng.choice(real, real.size)) for _ in range(n)]
    return est, float(np.quantile(bs, 0.025)), float(np.quantile(bs, 0.975))


def shape_parts(key: str) -> tuple[str, int, int]:
    """A shape's key (decision.Shape.key: `<workload>-p<prompt>-o<output>`) as workload, prompt and output."""
    workload, rest = key.rsplit("-p", 1)
    prompt, output = rest.split("-o")
    return workload, int(prompt), int(output)


def real_slice(a, run_dir: Path, doc: dict, d_acc: dict, work: Path, speedup: float) -> list[dict]:
    """The run's probes of the smallest shape repeated at speed-up 1, one grid point each (same flags, same load,
    same request count), accelerated figures × S against real."""
    shape = min({r["shape"] for r in doc["probe_log"]}, key=lambda s: (len(s), s))
    picks: list[dict] = []
    for r in doc["probe_log"]:
        if r["shape"] == shape and r["config"] not in {p["config"] for p in picks}:
            picks.append(r)
    picks = sorted(picks, key=lambda r: r["load"])[: a.real_probes]
    out = []
    rng = np.random.default_rng(0)
    flags_of = {}
    exp_acc = _validate(json.loads(json.dumps(d_acc)))
    for cp in planner.make_plan(exp_acc).configs:
        flags_of[cp.config.id] = dict(cp.config.flags)
    bundle_of = {b["name"]: b for b in d_acc["server"]["bundles"]}
    for r in picks:
        bname = next(n for n in bundle_of if r["config"].endswith(n))
        b = json.loads(json.dumps(bundle_of[bname]))
        b["flags"]["sim_calibration"] = b["flags"]["sim_calibration"].replace(
            f"speedup={speedup:g}", "speedup=1"
        )
        requests = r["requests"]
        d = json.loads(json.dumps(d_acc))
        d.pop("decide")
        d["name"] = f"real-{r['config']}-c{r['load']}"[:60]
        d["server"]["bundles"] = [b]
        workload, prompt, output = shape_parts(shape)
        d["load"].update(
            prompt_tokens=[prompt], output_tokens=[output], concurrency=[r["load"]], requests=requests
        )
        if isinstance(d["load"].get("workload"), list):  # a cut with --agent: the shape's own workload only
            d["load"]["workload"] = [workload]
        d.pop("budget", None)
        f = work / f"{d['name']}.yaml"
        f.write_text(yaml.safe_dump(d, sort_keys=False))
        out_dir = work / "real-runs" / d["name"]
        rc, wall = run_servesweep(["run", str(f), "--out", str(out_dir)], work / f"{d['name']}.log", 900)
        rdir = next(out_dir.iterdir())
        m = json.loads((rdir / "manifest.json").read_text())
        (pid,) = list(m["points"])
        real = probe_samples(rdir, [pid])
        acc = probe_samples(run_dir, r["points"])
        acc = {k: v * speedup for k, v in acc.items()}
        row = {
            "config": r["config"],
            "shape": shape,
            "load": r["load"],
            "requests": requests,
            "rc": rc,
            "real_wall_s": round(wall, 1),
            "n_acc": int(acc["e2e"].size),
            "n_real": int(real["e2e"].size),
        }
        for metric, st in (
            ("ttft_p50", np.median),
            ("ttft_p95", lambda x: np.percentile(x, 95)),
            ("tpot_p50", np.median),
        ):
            row[metric] = ratio_interval(acc[metric[:4]], real[metric[:4]], st, rng)
        # throughput = load × output / mean E2E: its ratio is the inverse of the mean E2E's
        e = ratio_interval(real["e2e"], acc["e2e"], np.mean, rng)
        row["throughput"] = e
        out.append(row)
    return out


# ---------------------------------------------------------------- main


def _print_misses(agree: dict) -> None:
    for m in agree["misses"]:
        flags = [w for w, on in (("tie within resolution", m["within_resolution"]), ("SLO tie", m.get("slo_tie")),
                                 ("dropped unprobed", m.get("unprobed"))) if on]  # fmt: skip
        print(f"  miss {m['question']}: {m['why']}{' (' + ', '.join(flags) + ')' if flags else ''}")
        if m.get("engine"):
            print(f"    on the engine: {m['engine']}")
    print(
        f"  with the misses explained (ties within resolution, SLO ties within 5 % of a threshold on the engine, "
        f"the best's cell probed): "
        f"{explained_share(agree):.1%}"
    )


def one_run(a, work: Path, tag: str, budget_s: float | None) -> dict:
    d, hidden = cut_experiment(a, work, speedup=a.speedup, budget_s=budget_s, name=f"bdr-{tag}")
    f = work / f"{tag}.yaml"
    out_dir = work / f"runs-{tag}"
    if getattr(a, "rescore", False) and out_dir.is_dir():  # the kept run, scored again (its decision.json)
        run_dir = next(out_dir.iterdir())
        doc = json.loads((run_dir / "decision.json").read_text())
        rc, wall = (0 if doc.get("status") == "finished" else 2), float(doc["elapsed_s"])
        return {"rc": rc, "wall_s": wall, "doc": doc, "run_dir": run_dir, "d": d, "hidden": hidden, "file": f}
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    rc, wall = run_servesweep(
        ["run", str(f), "--out", str(out_dir), "--max-parallel", str(a.max_parallel)], work / f"{tag}.log", a.timeout
    )
    run_dir = next(out_dir.iterdir())
    doc = json.loads((run_dir / "decision.json").read_text())
    return {"rc": rc, "wall_s": wall, "doc": doc, "run_dir": run_dir, "d": d, "hidden": hidden, "file": f}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child_run(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment", nargs="?", default=str(ROOT / "examples/qwen36-27b-rtxpro6000-decide.yaml"))
    ap.add_argument("--tp", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--bundles", type=lambda s: s.split(","), default=["ar", "dflash", "ddtree32"])
    ap.add_argument("--prompts", type=lambda s: [int(x) for x in s.split(",")], default=[3000, 30000])
    ap.add_argument("--outputs", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024])
    ap.add_argument("--agent", action="store_true",
                    help="the example's agent sessions too (3k prompts, 256-token answers, 8 turns)")
    ap.add_argument("--speedup", type=float, default=20.0)
    ap.add_argument("--model-error", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--jobs", type=int, default=1, help="processes for the engine's exhaustive answer")
    ap.add_argument("--max-parallel", type=int, default=1,
                    help="lanes of the packed decision at once (1: one server at a time; each lane is an emulator "
                    "and a Locust at --speedup: on a small machine more lanes measure the machine, not the engine)")
    ap.add_argument("--real-probes", type=int, default=3)
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-half", action="store_true")
    ap.add_argument("--plan-only", action="store_true", help="price the cut (servesweep plan) and stop")
    ap.add_argument(
        "--truth-only", action="store_true", help="compute (and keep in --out) the engine's exhaustive answer, stop"
    )
    ap.add_argument("--out", default="/tmp/bench_decision_run")
    ap.add_argument("--model-report", action="store_true",
                    help="the step model's values against the engine's exhaustive ones (kept in --out), and stop")
    ap.add_argument("--rescore", action="store_true",
                    help="score the run kept in --out again (its decision.json) instead of running it")
    ap.add_argument("--explain", action="store_true",
                    help="explain the misses of the report kept in --out on the engine (SLO ties), and stop")
    a = ap.parse_args(argv)
    work = Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    t_bench = time.monotonic()
    d, hidden = cut_experiment(a, work, speedup=1.0, budget_s=None, name="bdr-real")
    exp_real = _validate(json.loads(json.dumps(d)))
    plan = planner.make_plan(exp_real)
    from servesweep.matrix.decision import Noise, run_decision, simulated_measure

    cells = planner.decision_cells(plan)  # the real-speed prior: the plan's predicted time at real speed
    pred = run_decision(
        cells,
        exp_real.decide.tiers,  # type: ignore[union-attr]
        simulated_measure(Noise(), {c.key: c.predicted for c in cells}, 0),
        **planner.decision_settings(exp_real),
        noise=Noise(),
    )
    pd = pred.as_dict()
    print(
        f"cut: TP {a.tp} x {a.bundles}, {'single + agent' if a.agent else 'single'}, prompts {a.prompts}, "
        f"outputs {a.outputs}: {len(plan.configs)} configurations, {len(cells)} cells, "
        f"{len({c.shape.key for c in cells}) * len(exp_real.decide.tiers)} questions; "  # type: ignore[union-attr]
        f"plan at real speed: {len(pred.records)} probes, {sum(pred.config_seconds.values()) / 3600:.2f} h serial, "
        f"{pd['gpu_seconds'] / 3600:.2f} GPU-h"
    )
    if a.plan_only:
        return 0
    t0 = time.monotonic()
    tiers = exp_real.decide.tiers  # type: ignore[union-attr]
    # the engine's answer depends on the cut, the hidden calibrations and the seed only: kept in the out folder
    # (a re-run on another decision algorithm reuses it: 10 minutes of virtual-time closed loops here)
    # (single-shot and agent cells kept apart: a cut with --agent reuses the single-shot answer of one without)
    truth, caps = {}, {}
    for kind, name in (("synthetic", "engine_truth.json"), ("agent", "engine_truth_agent.json")):
        if kind == "agent" and not a.agent:
            continue
        key = json.dumps([a.tp, a.bundles, a.prompts, a.outputs, hidden, tiers, a.seed], sort_keys=True)
        cache_file = work / name
        cached = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
        if cached.get("key") == key:
            got = (
                {tuple(k.split("|")): v for k, v in cached["truth"].items()},
                {tuple(k.split("|")): v for k, v in cached["caps"].items()},
            )
        else:
            got = engine_truth(exp_real, hidden, tiers, a.seed, a.jobs, kinds=(kind,))
            cache_file.write_text(
                json.dumps(
                    {
                        "key": key,
                        "truth": {"|".join(k): v for k, v in got[0].items()},
                        "caps": {"|".join(k): v for k, v in got[1].items()},
                    }
                )
            )
        # a shape's key names its workload ("chat" in a cut without the agent's workloads, "single" with them): the
        # cached answer's keys are renamed to this cut's by prompt and output length
        name_of = {(c.shape.prompt, c.shape.output): c.shape.workload for c in cells if c.shape.kind == kind}

        def renamed(key: str, name_of: dict = name_of) -> str:
            workload, p, o = shape_parts(key)
            return f"{name_of.get((p, o), workload)}-p{p}-o{o}"

        truth.update({(renamed(k[0]), *k[1:]): v for k, v in got[0].items()})
        caps.update({(k[0], renamed(k[1]), *k[2:]): v for k, v in got[1].items()})
    truth_s = time.monotonic() - t0
    print(f"exhaustive answer on the engine: {len(truth)} questions, {len(caps)} capacities, {truth_s:.0f} s")
    if a.truth_only:
        return 0
    if a.model_report:
        got = model_against_engine(exp_real, truth, tiers)
        for label, r in got.items():
            print(f"engine / step model ({label} the hidden calibration): x {r['ratio']:.3f} over {r['n']} (cell, tier) "
                  f"values, log-sd {r['log_sd']:.3f}; per configuration: "
                  + ", ".join(f"{k} {v}" for k, v in r["per_config"].items()))  # fmt: skip
        return 0
    if a.explain:  # a kept report's misses explained on the engine (its run folder may be gone)
        rep = json.loads((work / "report.json").read_text())
        agree = rep["full"]["agreement"]
        for m in agree["misses"]:
            m["question"] = tuple(m["question"])
        probed = {tuple(x) for x in rep["full"]["probed"]}
        explain_on_engine(agree["misses"], exp_real, hidden, tiers, caps, a.seed, probed)
        _print_misses(agree)
        rep["full"]["agreement"] = agree
        (work / "report.json").write_text(json.dumps(rep, indent=2, default=str))
        return 0
    full = one_run(a, work, "full", None)
    doc = full["doc"]
    res = exp_real.decide.resolution  # type: ignore[union-attr]
    agree = agreement_of(doc, truth, res, caps, tiers)
    probed = sorted({(r["config"], r["shape"]) for r in doc["probe_log"]})
    explain_on_engine(agree["misses"], exp_real, hidden, tiers, caps, a.seed, set(probed))
    probe_real_s = sum(r["seconds"] for r in doc["probe_log"]) * a.speedup
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cut": {"tp": a.tp, "bundles": a.bundles, "prompts": a.prompts, "outputs": a.outputs, "agent": a.agent},
        "speedup": a.speedup,
        "model_error": a.model_error,
        "seed": a.seed,
        "hidden": hidden,
        "truth_s": round(truth_s, 1),
        "plan_real": {
            "probes": len(pred.records),
            "serial_s": sum(pred.config_seconds.values()),
            "gpu_s": pd["gpu_seconds"],
        },
        "full": {
            "rc": full["rc"],
            "wall_s": round(full["wall_s"], 1),
            "probes": doc["probes"],
            "label": doc["label"],
            "states": doc["states"],
            "elapsed_s": doc["elapsed_s"],
            "probe_s_accelerated": round(sum(r["seconds"] for r in doc["probe_log"]), 1),
            "probe_s_at_real_speed": round(probe_real_s, 1),
            "agreement": agree,
            "explained": explained_share(agree),
            "probed": probed,
            "run_dir": str(full["run_dir"]),
        },
    }
    print(f"full run: rc {full['rc']}, {full['wall_s']:.0f} s wall, {doc['probes']} probes, {doc['label']}")
    print(
        f"  agreement with the engine's exhaustive answer: exact {agree['exact']:.1%}, within resolution "
        f"{agree['within_resolution']:.1%} ({agree['questions']} questions; {agree['ties']} answered as ties)"
    )
    print(
        f"  probes' request time {report['full']['probe_s_accelerated']} s accelerated = "
        f"{probe_real_s / 3600:.2f} h at real speed (+ {doc['probes']} x the point overhead)"
    )
    _print_misses(agree)
    if not a.skip_half:
        half_s = max(1.0, doc["elapsed_s"] / 2)
        half = one_run(a, work, "half", half_s)
        hdoc = half["doc"]
        hag = agreement_of(hdoc, truth, res, caps, tiers)
        report["half"] = {
            "budget_s": half_s,
            "rc": half["rc"],
            "wall_s": round(half["wall_s"], 1),
            "status": hdoc["status"],
            "label": hdoc["label"],
            "probes": hdoc["probes"],
            "states": hdoc["states"],
            "agreement": hag,
        }
        print(
            f"half budget ({half_s:.0f} s): rc {half['rc']}, {hdoc['status']}, {hdoc['probes']} probes, "
            f"{hdoc['label']}; exact {hag['exact']:.1%}, within resolution {hag['within_resolution']:.1%}"
        )
    if not a.skip_real:
        rows = real_slice(a, full["run_dir"], doc, full["d"], work, a.speedup)
        report["real_slice"] = rows
        for r in rows:
            print(
                f"real slice {r['config']} {r['shape']} c{r['load']} ({r['n_acc']} vs {r['n_real']} requests, "
                f"{r['real_wall_s']} s): accelerated x {a.speedup:g} / real: "
                + "; ".join(
                    f"{k} {r[k][0]:.3f} [{r[k][1]:.3f}, {r[k][2]:.3f}]"
                    for k in ("ttft_p50", "ttft_p95", "tpot_p50", "throughput")
                )
            )
    report["bench_s"] = round(time.monotonic() - t_bench, 1)
    (work / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"bench {report['bench_s']} s; {work / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
