"""The decision planner: the probes that answer an experiment's `decide:` question, and the answer they give.

The question (config/decide.py): for each workload shape (workload × prompt × output) and per-user speed tier,
which server configuration serves the most output tokens/s per GPU at its capacity for the tier (the largest
concurrency at which every SLO of the tier holds). One *cell* is a (configuration, shape): what can be probed at a
concurrency; one *question* is a (shape, tier). A pure module: the caller hands in the cells (each with the step
model's prediction, its prior) and `measure(cell, load, requests)`; nothing here starts a server (docs/decision.md).

The levers, each a few lines below:
- **sequential stopping** (`sequential_probe`): a probe's requests are looked at after n0, 2 n0, 4 n0, ... and the
  probe stops at the first look where every open tier's verdict and the throughput are known to the resolution.
  The intervals stay valid whatever look it stops at: look k is judged at alpha_k = alpha · 6 / (pi² k²), a union
  bound over looks (sum alpha_k = alpha); a percentile's interval is the distribution-free order-statistic bound
  (matrix/capacity_search.py), the throughput's a normal interval of the mean E2E (asymptotic).
- **racing** (`derive`): a configuration leaves a question once its upper bound is below another's lower bound; a
  question is *decided* once the leader's lower bound times (1 + resolution) clears every rival's upper bound, a
  *tie* when the rivals' brackets are already at the capacity resolution and still overlap; a cell is no longer
  probed once every question of its shape is settled or has dropped it.
- **reuse**: a probe at concurrency C is judged for every tier of its shape; a configuration's measured/predicted
  ratios calibrate the step model for its other shapes (`calibration`), so their searches start near the answer.
- **emulator-guided priors and budget-aware order**: each search starts at the (calibrated) predicted capacity and
  brackets outward by small steps; each round probes the cells in most-open-questions-per-GPU-second order, so a
  budget cut leaves the cheapest informative work done; `answer()` is the labelled best-so-far at any moment.

Bounds on a cell's value for a tier assume throughput rises with concurrency up to the capacity (closed loop: it
does, flat above the running-request cap): value ∈ [tput_low(last pass), tput_high(first fail)] / GPUs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from servesweep.matrix.capacity_search import Slo, _order_statistic_interval, parse_tier

Prediction = dict[str, float]  # ttft, tpot, e2e (s) and throughput (req/s) of one closed-loop concurrency
Status = Literal["decided", "tie", "none", "leading", "open"]
PER_METRIC = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "decode_tokens_per_s": "tpot"}


@dataclass(frozen=True)
class Shape:
    workload: str  # the workload's name in the experiment (load.workload)
    prompt: int
    output: int
    kind: str = "synthetic"  # what its requests are (LoadPoint.workload): agent sessions, shared prefixes, ...
    turns: int = 1  # requests per session of an agent shape (session_turns): a probe runs its users' sessions whole

    @property
    def key(self) -> str:
        return f"{self.workload}-p{self.prompt}-o{self.output}"


@dataclass
class Cell:
    """One configuration at one shape: the loads it may be probed at and the step model's prediction there."""

    config: str
    shape: Shape
    gpus: int
    lower: int
    upper: int
    predict: Callable[[int], Prediction]
    start_s: float = 0.0  # its server's start and stop (once per configuration)
    _cache: dict[int, Prediction] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.config, self.shape.key

    def predicted(self, load: int) -> Prediction:
        if load not in self._cache:
            self._cache[load] = self.predict(load)
        return self._cache[load]


@dataclass(frozen=True)
class Noise:
    """The measurement model: each request's TTFT, TPOT and E2E are the prediction times an independent
    log-normal factor (median 1). Population quantiles follow in closed form (`population`)."""

    ttft: float = 0.25
    tpot: float = 0.08
    e2e: float = 0.08

    def quantile(self, metric: str, base_s: float, q: float) -> float:
        """The q-quantile of a metric in its SLO unit (ms, or tok/s for decode speed)."""
        z = NormalDist().inv_cdf(q)
        if metric == "decode_tokens_per_s":  # 1 / TPOT: the log-normal mirrored
            return (1.0 / base_s) * math.exp(self.tpot * z)
        return 1000.0 * base_s * math.exp(getattr(self, metric) * z)

    def throughput(self, p: Prediction, load: int, output: int) -> float:
        """Output tok/s of the closed loop: load users / mean E2E × output tokens."""
        return load * output / (p["e2e"] * math.exp(self.e2e**2 / 2))

    def draw(self, p: Prediction, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {m: p[m] * np.exp(getattr(self, m) * rng.standard_normal(n)) for m in ("ttft", "tpot", "e2e")}


def holds_population(slos: Sequence[Slo], p: Prediction, noise: Noise) -> bool:
    """Whether every SLO of a tier holds for the population a prediction describes (no sampling error)."""
    for s in slos:
        q = float(s.stat[1:]) / 100.0 if s.stat else 0.5
        if not s.holds(noise.quantile(s.metric, p[PER_METRIC[s.metric]], q)):
            return False
    return True


def capacity(
    cell: Cell, slos: Sequence[Slo], noise: Noise, predict: Callable[[int], Prediction] | None = None
) -> int | None:
    """The largest load before the first failing one, scanning every concurrency (None: fails at lower)."""
    f = predict or cell.predicted
    best = None
    for c in range(cell.lower, cell.upper + 1):
        if not holds_population(slos, f(c), noise):
            break
        best = c
    return best


# ---------------------------------------------------------------- one probe


@dataclass
class Measured:
    """Per-request values of one probe (seconds), its output tokens per request and the window it took."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    output: int
    seconds: float | None = None  # what the probe's looks took (a real run); None: priced from the prediction


@dataclass
class ProbeRecord:
    """One load of one cell measured: requests, cost, each tier's verdict, output tok/s per GPU with its interval,
    and the medians the calibration compares with the prediction."""

    config: str
    shape: str
    load: int
    requests: int
    seconds: float
    gpus: int
    verdicts: dict[str, str]
    tput: tuple[float, float, float]  # (low, estimate, high) tok/s per GPU
    ratios: dict[str, float]  # measured median / predicted, per metric
    at_cap: bool = False
    order: int = 0
    guessed: tuple[str, ...] = ()  # tiers whose verdict the point estimate gave at the cap (not proven)
    # the shape whose one-user stream measured it (`Decider` shares a load-1 probe among a prompt length's output
    # lengths); None: measured as itself, on its own stream
    measured_as: str | None = None
    skipped: int = 0  # requests run and not judged: each look's first round (`skip_first_round`)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def independent(records: Iterable[ProbeRecord]) -> list[ProbeRecord]:
    """The records that measured apart: of those one shared one-user stream gave (`measured_as`), the one that saw
    most of it (the others repeat its requests: a fit counting them would claim more than was measured)."""
    out: list[ProbeRecord] = []
    shared: dict[tuple[str, str], ProbeRecord] = {}
    for r in records:
        if r.measured_as is None:
            out.append(r)
            continue
        k = (r.config, r.measured_as)
        if k not in shared or r.requests > shared[k].requests:
            shared[k] = r
    return out + list(shared.values())


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)


def look_alpha(alpha: float, k: int) -> float:
    """The error spent at look k (1-based): alpha · 6 / (pi² k²); they sum to alpha over all looks."""
    return alpha * 6.0 / (math.pi**2 * k * k)


def _judge(s: Slo, v: np.ndarray, confidence: float, at_cap: bool, tolerance: float) -> str:
    """pass / fail when the interval clears the threshold; when the whole interval lies within `tolerance`
    (relative) of the threshold the statistic is known as well as the question needs it and the point estimate
    decides (the capacity is then right to about the resolution either way); at the request or time cap likewise."""
    q = float(s.stat[1:]) / 100.0 if s.stat else 0.5
    with np.errstate(divide="ignore"):  # a zero TPOT (a one-token answer) is an infinite decode speed
        vals = 1.0 / v if s.metric == "decode_tokens_per_s" else 1000.0 * v
    srt = np.sort(vals)
    low, high = _order_statistic_interval(srt, q, confidence)
    worst, best = (high, low) if s.upper_limit else (low, high)
    if s.holds(worst):
        return "pass"
    if not s.holds(best):
        return "fail"
    near = math.isfinite(low) and math.isfinite(high) and high - low <= 2 * tolerance * abs(s.value)
    if at_cap or near:
        return "pass" if s.holds(float(np.quantile(srt, q))) else "fail"
    return "undecided"


def sequential_probe(
    cell: Cell,
    load: int,
    tiers: Mapping[str, Sequence[Slo]],
    open_tiers: Iterable[str],
    draw: Callable[[int], Measured],
    *,
    confidence: float,
    resolution: float,
    max_requests: int,
    overhead_s: float,
    max_probe_s: float | None = None,
    max_looks: int = 4,
    min_rounds: float = 2.0,
    guess_extend: float = 1.0,
    measured: Cell | None = None,
    skip_first_round: bool = False,
    session_turns: int = 1,
) -> ProbeRecord:
    """Measure one load with looks at n0, 2 n0, ... (n0: enough for the tiers' percentiles and two rounds of the
    load) until every open tier's verdict is clear and the throughput's half-width is within resolution / 2; at
    max_requests (or once its requests would take max_probe_s) the point estimates decide (`at_cap`). `draw(n)` gives the first n requests of the probe (a run
    that keeps going: later looks see a longer prefix of the same stream). `measured`: the cell whose requests
    `draw` runs when it is not `cell` (a shared one-user stream): its throughput prices the probe.
    `skip_first_round`: above load 1, `draw(n)` judges n requests past each look's first round (each user's first
    request) and runs `load` more per look (a real run's look is a Locust start of its own): priced here, and the
    first look's rounds count the skipped one.
    `session_turns` > 1 (agent sessions, a request a turn): every look has each user run a whole session and one
    turn of the next (capacity_agent's rule: the judged turns are the session's mix, early and late, cache hits
    included), past `max_requests` and `max_probe_s` where those would cut the sessions."""
    alpha = 1.0 - confidence
    burst = first_round(load, skip_first_round)  # requests run and not judged, per look
    need = max(_first_look(s, look_alpha(alpha, 1)) for slos in tiers.values() for s in slos)
    rounds = min_rounds - 1 if burst else min_rounds
    whole = int(math.ceil(max(min_rounds, session_turns + 1) * load)) if session_turns > 1 else 0
    n = max(whole, min(max_requests, max(need, int(math.ceil(rounds * load)))))
    most_looks = max(1, int(max_looks))
    want = set(open_tiers) or set(tiers)
    p = cell.predicted(load)
    cost = (measured or cell).predicted(load)
    most = max_requests
    if max_probe_s is not None and cost["throughput"] > 0:  # the requests that fit the probe's time
        floor = max(_min_samples(s) for slos in tiers.values() for s in slos)
        # and past the opening burst: a closed loop's first `load` requests start together, before any user
        # waited for a running request to finish, so a probe cut within them measures the burst, not the load
        # (skipped, they are run on top: `burst`, and then a whole round past them: the first completions after
        # the burst are the round's shortest requests, whose mean E2E alone overstates the throughput, 2x seen)
        most = max(floor + load - burst, burst, min(max_requests, int(max_probe_s * cost["throughput"]) - burst))
    most = max(most, whole)  # an agent probe's sessions whole, however long they take
    n = min(n, most)  # the first look fits the time too (a pass it cannot prove: estimates decide)
    tol = {s.text: slo_tolerance(cell, s, load, resolution) for slos in tiers.values() for s in slos}
    # past the cap, a probe whose open verdict would be a guess may go on to guess_extend x its requests
    hard_most = max(most, int(most * guess_extend))
    extra_looks = 0 if hard_most == most else max(1, math.ceil(math.log2(guess_extend)))

    def judged(n_looked: int, m: Measured, a_k: float, at_cap: bool) -> dict[str, str]:
        out = {}
        for name, slos in tiers.items():
            vs = [
                _judge(
                    s,
                    m.tpot if s.metric in ("tpot", "decode_tokens_per_s") else getattr(m, s.metric),
                    1.0 - a_k,
                    at_cap,
                    tol[s.text],
                )
                for s in slos
            ]
            out[name] = "fail" if "fail" in vs else ("pass" if all(v == "pass" for v in vs) else "undecided")
        return out

    k = 0
    while True:
        k += 1
        m = draw(n)
        a_k = look_alpha(alpha, k)
        proven = judged(n, m, a_k, False)
        guessing = any(proven[t] == "undecided" for t in want)
        soft_cap = n >= most or k >= most_looks
        hard_cap = n >= hard_most or k >= most_looks + extra_looks
        cap = soft_cap and (not guessing or hard_cap)
        verdicts = judged(n, m, a_k, True) if cap else proven
        mean, sd = float(np.mean(m.e2e)), float(np.std(m.e2e, ddof=1))
        half = _z(a_k) * sd / math.sqrt(n)
        per_gpu = load * m.output / cell.gpus
        tput = (per_gpu / (mean + half), per_gpu / mean, per_gpu / max(mean - half, 1e-9))
        narrow = (tput[2] - tput[0]) / tput[1] <= 2 * resolution  # within ± the resolution
        if cap or (narrow and not guessing):
            break
        n = min(hard_most if soft_cap else most, 2 * n)
    window = (n + burst * k) / cost["throughput"] if cost["throughput"] > 0 else 0.0
    ratios = {x: float(np.median(getattr(m, x)) / p[x]) for x in ("ttft", "tpot", "e2e")}
    took = overhead_s + window if m.seconds is None else m.seconds
    guessed = tuple(t for t in tiers if cap and proven[t] == "undecided")
    return ProbeRecord(
        cell.config,
        cell.shape.key,
        load,
        n,
        took,
        cell.gpus,
        verdicts,
        tput,
        ratios,
        at_cap=cap,
        guessed=guessed,
        measured_as=None if measured is None else measured.shape.key,
        skipped=burst * k,
    )


def slo_tolerance(cell: Cell, s: Slo, load: int, resolution: float) -> float:
    """How close to its threshold a statistic may be left: the change the step model predicts for it over one
    capacity resolution step of load (elasticity × resolution), at least 1 %: a verdict decided inside that band
    moves the capacity by about one resolution step, which the question tolerates."""
    up = max(load + 1, int(math.ceil(load * (1 + resolution))))
    if up > cell.upper:
        up, load = load, max(cell.lower, int(math.floor(load / (1 + resolution))))
        if up == load:
            return resolution
    a, b = cell.predicted(load)[PER_METRIC[s.metric]], cell.predicted(up)[PER_METRIC[s.metric]]
    if a <= 0 or b <= 0:
        return resolution
    return min(resolution, max(0.01, abs(math.log(b / a))))


def _min_samples(s: Slo) -> int:
    from servesweep.matrix.capacity_search import min_samples

    return min_samples(s)


def _first_look(s: Slo, alpha_1: float) -> int:
    """Requests of the first look: matrix/capacity_search.py's minimum, and enough that the order-statistic interval of
    the percentile has a finite bound on the side that can prove a pass at look 1 (q^n <= alpha/2 for an upper
    limit on the value, (1 - q)^n for a lower one; decode speed is 1 / TPOT: its sides swap)."""
    q = float(s.stat[1:]) / 100.0 if s.stat else 0.5
    tail = q if s.upper_limit else 1.0 - q
    n = math.ceil(math.log(alpha_1 / 2) / math.log(tail)) if 0 < tail < 1 else 1
    return max(_min_samples(s), n)


# ---------------------------------------------------------------- what the probes so far say


@dataclass
class Bounds:
    """A cell's value for one tier: tok/s per GPU at its capacity, with the bracket it rests on."""

    low: float
    estimate: float
    high: float
    bracket: tuple[int | None, int | None]
    resolved: bool  # the capacity bracket is at the search resolution (more probes cannot narrow it)
    # a bound rests on the configuration's fitted calibration, not on this cell's probes
    from_prior: bool = False
    guessed: bool = False  # a bracketing verdict was the point estimate's at a probe's cap (not proven)


@dataclass
class QuestionAnswer:
    shape: str
    tier: str
    best: str | None  # None: no configuration serves the tier (or nothing measured)
    status: Status
    value: Bounds | None
    alive: list[str]
    dropped: list[str]
    label: str
    bar: float = 0.0  # the racing leader's lower bound (what the order weighs a rival's chance against)
    guessed: bool = False  # settled on a verdict the point estimate gave at a probe's cap (not proven)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["value"] = None if self.value is None else dict(self.value.__dict__)
        return d


@dataclass
class Answer:
    """The labelled answer of every question from the probes so far (anytime: complete or not)."""

    questions: list[QuestionAnswer]
    probes: int
    gpu_seconds: float
    confidence: float
    complete: bool

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.questions:
            out[q.status] = out.get(q.status, 0) + 1
        return out

    @property
    def label(self) -> str:
        c = self.counts()
        settled = sum(c.get(k, 0) for k in ("decided", "tie", "none"))
        head = "final answer" if self.complete else "best so far (not finished)"
        guessed = sum(1 for q in self.questions if q.guessed and q.status in ("decided", "tie"))
        return (
            f"{head}: {settled}/{len(self.questions)} questions settled ({c.get('decided', 0)} decided at "
            f"{self.confidence:.0%} per interval, {c.get('tie', 0)} ties within resolution, {c.get('none', 0)} "
            f"served by no configuration; {guessed} of them on a point estimate at a probe's cap), "
            f"{self.probes} probes, {self.gpu_seconds / 3600:.2f} GPU-h"
        )

    def best(self) -> dict[tuple[str, str], str | None]:
        return {(q.shape, q.tier): q.best for q in self.questions}

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "complete": self.complete,
            "probes": self.probes,
            "gpu_seconds": round(self.gpu_seconds, 1),
            "confidence": self.confidence,
            "counts": self.counts(),
            "questions": [q.as_dict() for q in self.questions],
        }


def _resolution_step(load: int, rel: float) -> float:
    return max(1.0, rel * load)


def cell_bounds(
    cell: Cell,
    tier: str,
    records: Sequence[ProbeRecord],
    rel: float,
    prior_high: float = math.inf,
    prior: PriorBounds | None = None,
) -> Bounds:
    """[low, high] of a cell's value for a tier from its probes (monotone capacity: a pass above the first fail is
    left out, as in matrix/capacity_search.py). Without a failing load the upper bound is `prior_high` (the step model's
    value times decide.prior_margin: an assumption on the model's error, not a measurement; inf: none). `prior`: the
    configuration's fitted calibration's bounds (`fitted_prior`): intersected with the measured ones on both sides
    (where they conflict the measurement wins), so a cell may be bounded, and its question decided, with no probe of
    its own."""
    b = _measured_bounds(cell, tier, records, rel, prior_high)
    if prior is None or b.resolved and b.high == 0.0:
        return b
    lo_load = b.bracket[0]
    if not b.resolved and lo_load is not None and 0 < prior.cap_high <= lo_load:
        # even z sigma faster the fitted model fails above the measured pass: the capacity is that load, and the
        # value its measured throughput (no probe of the next load needed)
        at = next(r for r in records if r.load == lo_load and r.verdicts.get(tier) == "pass")
        return Bounds(
            b.low, b.estimate, max(at.tput[2], b.low), b.bracket, True, from_prior=True, guessed=b.guessed
        )
    low, high = max(b.low, prior.low), min(b.high, prior.high)
    if low > high:  # the fit contradicts what this cell measured: the measurement alone
        return b
    est = b.estimate if b.bracket[0] is not None else prior.estimate
    return Bounds(
        low,
        min(max(est, low), high),
        high,
        b.bracket,
        b.resolved,
        from_prior=low > b.low or high < b.high,
        guessed=b.guessed,
    )


def _measured_bounds(
    cell: Cell, tier: str, records: Sequence[ProbeRecord], rel: float, prior_high: float = math.inf
) -> Bounds:
    fails = [r for r in records if r.verdicts.get(tier) == "fail"]
    hi = min(fails, key=lambda r: r.load) if fails else None
    passes = [r for r in records if r.verdicts.get(tier) == "pass" and (hi is None or r.load < hi.load)]
    lo = max(passes, key=lambda r: r.load) if passes else None
    bracket = (lo.load if lo else None, hi.load if hi else None)
    guessed = any(tier in r.guessed for r in (lo, hi) if r is not None)
    if hi is not None and hi.load <= cell.lower:
        return Bounds(0.0, 0.0, 0.0, bracket, True, guessed=guessed)
    low = lo.tput[0] if lo else 0.0
    est = lo.tput[1] if lo else 0.0
    if lo is not None and lo.load >= cell.upper:
        return Bounds(low, est, lo.tput[2], bracket, True, guessed=guessed)
    # tput(first fail) bounds the value from above; where noise makes it read below the last pass, the last pass's
    # own upper bound is kept (the bounds never cross)
    high = max(hi.tput[2], lo.tput[2] if lo else 0.0) if hi else max(prior_high, lo.tput[2] if lo else 0.0)
    resolved = (
        lo is not None and hi is not None and hi.load - lo.load <= _resolution_step(lo.load, rel) + 1e-9
    )
    return Bounds(low, est, high, bracket, resolved, guessed=guessed)


def derive(
    cells: Sequence[Cell],
    tiers: Sequence[str],
    records: Sequence[ProbeRecord],
    *,
    resolution: float,
    confidence: float,
    complete: bool = False,
    prior_high: Mapping[tuple[tuple[str, str], str], float] | None = None,
    prior_fit: Mapping[tuple[tuple[str, str], str], PriorBounds] | None = None,
    prior_value: Mapping[tuple[tuple[str, str], str], float] | None = None,
) -> Answer:
    """Every question's answer from the probes so far: racing (drop a configuration whose upper bound is below
    another's lower bound), then decided / tie / none / leading / open. Pure: the same probes give the same answer."""
    by_cell: dict[tuple[str, str], list[ProbeRecord]] = {}
    for r in records:
        by_cell.setdefault((r.config, r.shape), []).append(r)
    shapes: dict[str, list[Cell]] = {}
    for c in cells:
        shapes.setdefault(c.shape.key, []).append(c)
    out = []
    for shape, group in shapes.items():
        for tier in tiers:
            b = {
                c.config: cell_bounds(
                    c,
                    tier,
                    by_cell.get(c.key, []),
                    resolution,
                    (prior_high or {}).get((c.key, tier), math.inf),
                    (prior_fit or {}).get((c.key, tier)),
                )
                for c in group
            }
            floor = max(x.low for x in b.values())
            alive = [k for k, x in b.items() if x.high >= floor]
            dropped = [k for k in b if k not in alive]
            # the estimates first; among configurations with none (not measured, not fitted) the step model's value
            pick = {k: (prior_value or {}).get((c.key, tier), 0.0) for c in group for k in (c.config,)}
            leader = max(alive, key=lambda k: (b[k].estimate, b[k].low, pick[k]))
            rivals = [k for k in alive if k != leader]
            measured = bool(by_cell.keys() & {(k, shape) for k in alive})
            if all(b[k].high == 0.0 for k in alive):
                status: Status = "none"
            elif all(b[k].high <= b[leader].low * (1 + resolution) for k in rivals) and b[leader].low > 0:
                status = "decided"
            elif all(b[k].resolved for k in alive):
                status = "tie"
            else:
                status = "leading" if measured else "open"
            best = None if status == "none" else leader
            if status in ("leading", "open"):
                # the best guess so far (anytime: a run stopped now answers it, labelled): a measured or fitted
                # configuration's estimate, else the step model's value
                cell_of = {c.config: c for c in group}
                guess = {
                    k: b[k].estimate
                    if b[k].bracket != (None, None) or (cell_of[k].key, tier) in (prior_fit or {})
                    else pick[k]
                    for k in alive
                }
                best = max(alive, key=lambda k: guess[k]) if max(guess.values()) > 0 else None
            via = " (bounds from the fitted calibrations)" if any(b[k].from_prior for k in alive) else ""
            # the answer leans on a verdict the point estimate gave at a probe's cap: not proven at the confidence
            on_guess = any(x.guessed for x in b.values())
            via += (
                " (on a point estimate at a probe's cap)" if on_guess and status in ("decided", "tie") else ""
            )
            label = {
                "decided": f"{leader} (beats every rival by more than the resolution, or ties within it){via}",
                "tie": f"{leader} by its estimate; tied within resolution with {', '.join(rivals) or 'none'}{via}",
                "none": "no configuration holds this tier at the lowest load",
                "leading": f"{best} leads; {len(rivals)} rivals not yet excluded",
                "open": f"not measured yet; {best} by the step model" if best else "not measured yet",
            }[status]
            shown = b[best] if best is not None else b[leader]
            out.append(
                QuestionAnswer(
                    shape, tier, best, status, shown, alive, dropped, label, b[leader].low, on_guess
                )
            )
    gpu_s = sum(r.seconds * r.gpus for r in records)
    return Answer(out, len(records), gpu_s, confidence, complete)


def answer(
    cells: Sequence[Cell],
    tiers: Sequence[str],
    records: Sequence[ProbeRecord],
    *,
    resolution: float,
    confidence: float,
    prior_high: Mapping[tuple[tuple[str, str], str], float] | None = None,
    prior_fit: Mapping[tuple[tuple[str, str], str], PriorBounds] | None = None,
    prior_value: Mapping[tuple[tuple[str, str], str], float] | None = None,
) -> Answer:
    """The anytime answer: the labelled best-so-far of every question from whatever probes have been measured (a
    run stopped at any point, e.g. half its budget, reports this)."""
    return derive(
        cells,
        tiers,
        records,
        resolution=resolution,
        confidence=confidence,
        prior_high=prior_high,
        prior_fit=prior_fit,
        prior_value=prior_value,
    )


def prior_bounds(
    cells: Sequence[Cell],
    tiers: Mapping[str, Sequence[Slo]],
    noise: Noise,
    margin: float = 2.0,
    cal: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[tuple[tuple[str, str], str], float]:
    """`margin` × the step model's value of every (cell, tier) at its predicted capacity (at least the value
    at the lowest load: a tier the model says fails there may still hold). `cal`: per configuration, the
    measured / predicted ratios (`calibration`) applied first (its capacity found by bisection: monotone)."""
    out = {}
    for c in cells:
        ratio = (cal or {}).get(c.config)
        for name, slos in tiers.items():
            if ratio is None:
                cap = capacity(c, slos, noise) or c.lower
                p = c.predicted(cap)
            else:
                f = _calibrated(c, ratio)
                cap = _capacity_bisect(c, slos, noise, f) or c.lower
                p = f(cap)
            out[(c.key, name)] = margin * noise.throughput(p, cap, c.shape.output) / c.gpus
    return out


def calibrated_margin(margin: float, probes: int) -> float:
    """The prior margin of a configuration measured `probes` times: its excess over 1 shrinks as 1 / sqrt(1 + n)
    (the calibration removes the configuration's own model error) down to half (the error between shapes stays)."""
    return 1.0 + (margin - 1.0) * max(0.5, 1.0 / math.sqrt(1.0 + probes))


def _calibrated(cell: Cell, cal: Mapping[str, float]) -> Callable[[int], Prediction]:
    def f(c: int) -> Prediction:
        p = cell.predicted(c)
        return {**p, **{m: p[m] * cal[m] for m in ("ttft", "tpot", "e2e")}}

    return f


def _capacity_bisect(
    cell: Cell, slos: Sequence[Slo], noise: Noise, f: Callable[[int], Prediction]
) -> int | None:
    """`capacity` by bisection (the tier is assumed monotone in load): O(log(upper)) predictions."""
    if not holds_population(slos, f(cell.lower), noise):
        return None
    lo, hi = cell.lower, cell.upper + 1  # holds at lo; hi: fails (or beyond the range)
    if holds_population(slos, f(cell.upper), noise):
        return cell.upper
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds_population(slos, f(mid), noise):
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------- choosing the next probe


def calibration(config: str, records: Sequence[ProbeRecord]) -> dict[str, float]:
    """The configuration's measured / predicted medians (geometric mean over its probes): the step model's error
    for it, applied to its shapes not yet measured."""
    mine = independent(r for r in records if r.config == config)
    if not mine:
        return {"ttft": 1.0, "tpot": 1.0, "e2e": 1.0}
    return {m: float(np.exp(np.mean([math.log(r.ratios[m]) for r in mine]))) for m in ("ttft", "tpot", "e2e")}


METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class Fit:
    """A configuration's step-model calibration fitted to its probes: per metric the measured / predicted factor
    (geometric mean over its probes: what its bandwidth, FLOP/s efficiency and accept-length errors do to TTFT, TPOT
    and E2E) and the log-sd an unprobed shape's prediction keeps after it (the probes' scatter about the fit,
    shrunk toward `prior_sigma`, plus the fit's own error, plus `CELL_SIGMA`: the error the fit cannot see)."""

    ratios: dict[str, float]
    sigma: dict[str, float]
    probes: int


# The log-sd of an unprobed cell's own error, added to every fitted sigma: a few probes' scatter about the fit
# under-shows it (the per-cell error of a shape not probed and the sampling error of a 20-request median are larger
# than the probes show): on bench/bench_decision.py (5 % per cell) the fit's +-1.96 sigma held 86-89 % of probes
# without it, ~95 % with it.
CELL_SIGMA = 0.05


def _fit_group(shape: Shape) -> tuple[str, int]:
    """The shapes one calibration fit serves: a prompt length of one kind of workload."""
    return (shape.kind, shape.prompt)


def fit_calibration(
    config: str,
    records: Sequence[ProbeRecord],
    prior_sigma: float = 0.05,
    prior_weight: float = 2.0,
    group: Callable[[str], Any] | None = None,
    cell_sigma: float = CELL_SIGMA,
) -> dict[Any, Fit]:
    """The configuration's fits from its probes, one per group of shapes (`group(shape_key)`: the prompt length and
    kind of workload, so one long-context probe informs every output length of that context, while a 3k probe says
    little of a 100k prompt's attention time, nor a single-shot one of an agent session's): per group, log factor =
    mean of its probes' log(measured / predicted median); the residual variance is pooled over the configuration's
    groups and shrunk toward `prior_sigma`: (prior_weight · prior_sigma² + Σ residual²) / (prior_weight + n -
    groups) (a few probes cannot claim a tight fit); an unprobed shape's log-sd = sqrt(residual var · (1 + 1/n_group) + cell_sigma²) (`cell_sigma`: the
    unprobed cell's own error, which the probes' scatter under-shows: the bounds' interval is then honest at its
    confidence, so a configuration is not dropped, nor a question decided, on a bound that is too tight)."""
    mine = independent(r for r in records if r.config == config)
    key = group or (lambda shape: None)
    groups: dict[Any, list[ProbeRecord]] = {}
    for r in mine:
        groups.setdefault(key(r.shape), []).append(r)
    if not groups:
        return {}
    logs = {g: {m: np.log([r.ratios[m] for r in rs]) for m in METRICS} for g, rs in groups.items()}
    dof = prior_weight + len(mine) - len(groups)
    var = {
        m: (
            prior_weight * prior_sigma**2
            + sum(float(np.sum((v[m] - v[m].mean()) ** 2)) for v in logs.values())
        )
        / dof
        for m in METRICS
    }
    return {
        g: Fit(
            {m: math.exp(float(v[m].mean())) for m in METRICS},
            {m: math.sqrt(var[m] * (1.0 + 1.0 / len(groups[g])) + cell_sigma**2) for m in METRICS},
            len(groups[g]),
        )
        for g, v in logs.items()
    }


@dataclass(frozen=True)
class PriorBounds:
    """A cell's value for a tier from its configuration's fitted calibration: the value with every metric at its
    fitted factor (`estimate`), and with every metric z sigma faster (`high`) or slower (`low`): the capacity's
    cliff carries the metrics' error into the value, so it is computed, not assumed proportional."""

    low: float
    estimate: float
    high: float
    cap_high: int = 0  # the capacity with every metric z sigma faster (0: fails at the lowest load even so)


def fitted_prior(
    cells: Sequence[Cell], tiers: Mapping[str, Sequence[Slo]], noise: Noise, fit: Fit, z: float
) -> dict[tuple[tuple[str, str], str], PriorBounds]:
    """Every (cell, tier) of the fitted configuration's cells bounded by its calibrated step model."""
    out = {}
    for c in cells:
        f = {
            k: _calibrated(c, {m: fit.ratios[m] * math.exp(k * z * fit.sigma[m]) for m in METRICS})
            for k in (-1, 0, 1)
        }
        for name, slos in tiers.items():
            v = {k: _value(c, slos, noise, g) for k, g in f.items()}
            out[(c.key, name)] = PriorBounds(v[1][0], v[0][0], v[-1][0], v[-1][1])
    return out


def _value(
    cell: Cell, slos: Sequence[Slo], noise: Noise, f: Callable[[int], Prediction]
) -> tuple[float, int]:
    """Output tok/s per GPU at the capacity a prediction gives, and that capacity (0, 0: fails at the lowest
    load)."""
    cap = _capacity_bisect(cell, slos, noise, f)
    return (0.0, 0) if cap is None else (noise.throughput(f(cap), cap, cell.shape.output) / cell.gpus, cap)


def prior_capacity(cell: Cell, slos: Sequence[Slo], noise: Noise, cal: Mapping[str, float]) -> int:
    """The calibrated step model's capacity (lower when it predicts a fail there): where the search starts."""
    return _capacity_bisect(cell, slos, noise, _calibrated(cell, cal)) or cell.lower


def next_load(cell: Cell, bounds: Bounds, start: int, records: Sequence[ProbeRecord], tier: str) -> int:
    """Bracket outward from the prior by growing steps (x1.2, x1.5, x2 ...), then bisect geometrically."""
    lo, hi = bounds.bracket
    if lo is None and hi is None:
        return min(max(start, cell.lower), cell.upper)
    if lo is not None and hi is not None:
        mid = int(round(math.sqrt(lo * hi)))
        return min(max(mid, lo + 1), hi - 1)
    same = sum(1 for r in records if r.verdicts.get(tier) == ("pass" if hi is None else "fail"))
    f = min(2.0, 1.2 * 1.25 ** (same - 1)) if same < 4 else 2.0
    if hi is None:
        assert lo is not None
        return min(cell.upper, max(lo + 1, int(math.ceil(lo * f))))
    return max(cell.lower, min(hi - 1, int(math.floor(hi / f))))


@dataclass
class DecisionRun:
    """A finished (or budget-cut) decision: every probe in order, the answer, and the cost per configuration."""

    answer: Answer
    records: list[ProbeRecord]
    config_seconds: dict[str, float]  # probe seconds per configuration (its server's time, start included)
    config_gpus: dict[str, int]
    rounds: int
    budget_hit: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer.as_dict(),
            "probes": len(self.records),
            "rounds": self.rounds,
            "budget_hit": self.budget_hit,
            "gpu_seconds": round(
                sum(self.config_seconds[c] * self.config_gpus[c] for c in self.config_seconds), 1
            ),
            "config_seconds": {k: round(v, 1) for k, v in self.config_seconds.items()},
        }


# measure(cell, load) -> draw(n); measure(cell, load, skip_first_round=True): draw's n requests are past each look's
# first round, which it runs on top (a real run; simulated draws have no opening burst)
Measure = Callable[..., Callable[[int], Measured]]


def first_round(load: int, skip_first_round: bool) -> int:
    """The requests a look runs on top and does not judge: its users' first ones (none at load 1: no burst)."""
    return load if skip_first_round and load > 1 else 0


def bounds_first_tokens(tiers: Mapping[str, Sequence[Slo]], want: Iterable[str]) -> bool:
    """Whether an open tier bounds TTFT or E2E: the statistics a closed loop's opening burst inflates (its users'
    prefills queue behind each other); a decode-speed tier's TPOT is measured past the first token."""
    return any(PER_METRIC[s.metric] in ("ttft", "e2e") for t in want for s in tiers[t])


@dataclass
class Work:
    """A cell that may be probed next: its open tiers and its chance to be an answer per predicted GPU-second."""

    score: float
    cell: Cell
    want: list[str]


class Decider:
    """The decision's state between probes: the probe records, the step model's bounds (prior, calibrated, fitted),
    where each (cell, tier) search started and which ones cannot move. `run_decision` drives it one probe at a time;
    matrix/decision_packed.py drives it with probes of several configurations in flight. Its methods are called from
    one thread; `probe` alone reads nothing that changes, so it may run in another (a real probe's thread)."""

    def __init__(
        self,
        cells: Sequence[Cell],
        tier_texts: Mapping[str, Sequence[str]],
        *,
        confidence: float = 0.95,
        resolution: float = 0.05,
        max_requests: int = 800,
        max_probe_s: float | None = 900.0,
        max_looks: int = 4,
        prior_margin: float = 2.0,
        unprobed_margin: float | None = None,
        min_rounds: float = 2.0,
        overhead_s: float = 6.0,
        noise: Noise | None = None,
        use_prior: bool = True,
        calibrate_prior: bool = True,
        fit_prior: bool = True,
        fit_min_probes: int = 1,
        prior_sigma: float = 0.05,
        cell_sigma: float = CELL_SIGMA,
        guess_extend: float = 1.0,
        race: bool = True,
        share_one_user: bool = False,
        knee_margin: float | None = 2.0,
        skip_first_round: bool = False,
    ):
        self.cells = searched_cells(cells, knee_margin)
        self.noise = noise or Noise()
        self.tiers = {k: parse_tier(list(v)) for k, v in tier_texts.items()}
        self.names = list(self.tiers)
        self.confidence, self.resolution = confidence, resolution
        self.max_requests, self.max_probe_s, self.max_looks = max_requests, max_probe_s, max_looks
        self.prior_margin, self.min_rounds, self.overhead_s = prior_margin, min_rounds, overhead_s
        self.unprobed_margin = unprobed_margin
        self.use_prior, self.calibrate_prior, self.fit_prior = use_prior, calibrate_prior, fit_prior
        self.fit_min_probes, self.prior_sigma, self.cell_sigma = fit_min_probes, prior_sigma, cell_sigma
        self.guess_extend, self.race = guess_extend, race
        self.skip_first_round = skip_first_round
        self.records: list[ProbeRecord] = []
        self.starts: dict[tuple[tuple[str, str], str], int] = {}
        self.seconds: dict[str, float] = {}  # per configuration: its server's start and its probes
        self.gpus = {c.config: c.gpus for c in cells}
        self.kw: dict[str, Any] = {"resolution": resolution, "confidence": confidence}
        if use_prior:
            # the step model's value, and the bound before a probe: `unprobed_margin` x it (None: prior_margin;
            # inf: never dropped unmeasured); a probe then bounds its cells by prior_margin x the calibrated model
            # (`add`: with unprobed_margin set, only its own prompt length's)
            self.kw["prior_value"] = prior_bounds(self.cells, self.tiers, self.noise, 1.0)
            first = prior_margin if unprobed_margin is None else unprobed_margin
            self.kw["prior_high"] = {k: first * v if v > 0 else v for k, v in self.kw["prior_value"].items()}
        self.stuck: set[tuple[tuple[str, str], str]] = (
            set()
        )  # (cell, tier) whose next load was probed already
        self.by_cell: dict[tuple[str, str], list[ProbeRecord]] = {}
        # a fit's group: one prompt length's shapes of one kind of workload (an agent session starting at 3k tokens
        # grows its context turn by turn on a warm cache: a single-shot 3k probe's calibration says little of it)
        self.group_of = {c.shape.key: _fit_group(c.shape) for c in cells}
        self.checked: set[tuple[tuple[str, str], int]] = set()
        self.cell_of = {c.key: c for c in self.cells}
        # a load-1 cell -> the cell whose one-user stream measures it (shared by its prompt length's outputs)
        self.one_user = one_user_sources(self.cells) if share_one_user else {}
        self.streams: dict[tuple[str, str], _Stream] = {}  # per source cell: the one-user stream so far

    def answer(self, *, complete: bool = True) -> Answer:
        return derive(self.cells, self.names, self.records, complete=complete, **self.kw)

    def fork(self) -> Decider:
        """A copy whose records and bounds change apart from this one's (the cells and settings are shared): for
        looking ahead at what the decision would probe next if the step model's calibrated predictions held."""
        other = copy.copy(self)
        other.records = list(self.records)
        other.starts, other.seconds = dict(self.starts), dict(self.seconds)
        other.kw = {k: dict(v) if isinstance(v, dict) else v for k, v in self.kw.items()}
        other.stuck, other.checked = set(self.stuck), set(self.checked)
        other.by_cell = {k: list(v) for k, v in self.by_cell.items()}
        other.streams = {}  # a fork measures on its own (the model's) streams, never the run's
        return other

    def expected(self, cell: Cell) -> Callable[[int], Prediction]:
        """The cell's prediction calibrated to its configuration's probes so far."""
        return _calibrated(cell, calibration(cell.config, self.records))

    def work(
        self, ans: Answer, *, running: str | None = None, configs: Iterable[str] | None = None
    ) -> list[Work]:
        """The cells still worth a probe (contending in an open question, bracket not resolved), each scored by its
        chance to be an answer (its upper bound over the question's best lower bound, summed over its open tiers) per
        predicted GPU-second; `running`: the configuration whose server is up (one server at a time: another's costs
        its server's start again); `configs`: only these configurations' cells. Empty: nothing more to learn."""
        open_q = {(q.shape, q.tier): q for q in ans.questions if q.status in ("leading", "open")}
        if not open_q and self.race:
            return []
        only = None if configs is None else set(configs)
        top = {k: max((x for x in (_high(q),) if math.isfinite(x)), default=1.0) for k, q in open_q.items()}
        out = []
        for c in self.cells:
            if only is not None and c.config not in only:
                continue
            mine = self.by_cell.get(c.key, [])
            want = []
            score = 0.0
            for t in self.names:
                q = open_q.get((c.shape.key, t))
                if (c.key, t) in self.stuck or (self.race and (q is None or c.config not in q.alive)):
                    continue
                bt = cell_bounds(
                    c,
                    t,
                    mine,
                    self.resolution,
                    self.kw.get("prior_high", {}).get((c.key, t), math.inf),
                    self.kw.get("prior_fit", {}).get((c.key, t)),
                )
                if bt.resolved:
                    continue
                want.append(t)
                best = top.get((c.shape.key, t), 1.0)
                score += min(bt.high, 10 * best) / max(best, 1e-9)
            if not want:
                continue
            skip = self.skip_first_round and bounds_first_tokens(self.tiers, want)
            cost = _predicted_probe_s(c, mine, self.overhead_s, self.one_user.get(c.key), skip)
            cost *= c.gpus
            if running is not None and running != c.config:
                cost += c.start_s * c.gpus
            out.append(Work(score / max(cost, 1e-9), c, want))
        return out

    def load_for(self, w: Work) -> int | None:
        """The load to probe `w`'s cell at: its widest (relative) open tier's next load (a probe serves every tier
        all the same); None when that bracket cannot move (the (cell, tier) is then left out of `work`)."""
        c, mine = w.cell, self.by_cell.get(w.cell.key, [])
        tb = {t: cell_bounds(c, t, mine, self.resolution) for t in w.want}
        tier = max(w.want, key=lambda t: _width(tb[t], c))
        key = (c.key, tier)
        if key not in self.starts:
            self.starts[key] = prior_capacity(
                c, self.tiers[tier], self.noise, calibration(c.config, self.records)
            )
        load = next_load(c, tb[tier], self.starts[key], mine, tier)
        if any(r.load == load for r in mine):  # the bracket cannot move: nothing more to learn here
            self.stuck.add(key)
            return None
        return load

    def probe(self, cell: Cell, load: int, want: Sequence[str], measure: Measure, **over: Any) -> ProbeRecord:
        """One sequential probe on the decision's settings, `over` replacing some (reads only the settings: may run
        outside the deciding thread)."""
        kw: dict[str, Any] = {
            "confidence": self.confidence,
            "resolution": self.resolution,
            "max_requests": self.max_requests,
            "overhead_s": self.overhead_s,
            "max_probe_s": self.max_probe_s,
            "max_looks": self.max_looks,
            "min_rounds": self.min_rounds,
            "guess_extend": self.guess_extend,
        }
        src = self.one_user.get(cell.key) if load == 1 else None
        if src is None:
            # the opening burst left out where it matters: above load 1, for a tier on first tokens (an agent
            # session's first turn is part of its workload's mix, never skipped)
            sessions = cell.shape.turns
            skip = self.skip_first_round and load > 1 and sessions == 1 and bounds_first_tokens(self.tiers, want)
            draw = measure(cell, load, skip_first_round=True) if skip else measure(cell, load)
            return sequential_probe(
                cell, load, self.tiers, want, draw, skip_first_round=skip, session_turns=sessions, **{**kw, **over}
            )
        return sequential_probe(
            cell, load, self.tiers, want, self._one_user_draw(cell, src, measure), measured=src, **{**kw, **over}
        )

    def _one_user_draw(self, cell: Cell, src: Cell, measure: Measure) -> Callable[[int], Measured]:
        """`cell` at load 1 from `src`'s one-user stream (started on first use, extended as looks need more
        requests, its requests already measured reused at no cost): the probe costs only what it adds."""
        st = self.streams.get(src.key)
        if st is None:
            st = self.streams[src.key] = _Stream(measure(src, 1))
        base_s = st.seconds
        thr = src.predicted(1)["throughput"]
        charged = False

        def draw(n: int) -> Measured:
            nonlocal charged
            m = st.draw(n)
            if n > st.n:
                if m.seconds is not None:  # a real run: what its looks took
                    st.seconds = m.seconds
                else:  # priced as sequential_probe prices a probe: its overhead once, its new requests' window
                    st.seconds += (0.0 if charged else self.overhead_s) + (n - st.n) / max(thr, 1e-9)
                    charged = True
                st.n = n
            out = one_user_derived(m, src, cell)
            out.seconds = st.seconds - base_s
            return out

        return draw

    def add(self, rec: ProbeRecord, cell: Cell, *, start_s: float | None = None) -> None:
        """A probe's record: kept, its configuration's cells re-bounded by its fitted and calibrated model.
        `start_s`: the server start it paid (default: the cell's, once per configuration)."""
        c = cell
        rec.order = len(self.records) + 1
        if start_s is None:
            start_s = 0.0 if c.config in self.seconds else c.start_s
        self.seconds[c.config] = self.seconds.get(c.config, 0.0) + start_s + rec.seconds
        self.records.append(rec)
        self.by_cell.setdefault(c.key, []).append(rec)
        n_c = len(independent(r for r in self.records if r.config == c.config))
        mine_cells = [x for x in self.cells if x.config == c.config]
        # both bounds of its cells from its fitted calibration
        if self.fit_prior and n_c >= self.fit_min_probes:
            fits = fit_calibration(
                c.config, self.records, self.prior_sigma, group=self.group_of.get, cell_sigma=self.cell_sigma
            )
            for g, fit in fits.items():
                self.kw.setdefault("prior_fit", {}).update(
                    fitted_prior(
                        [x for x in mine_cells if _fit_group(x.shape) == g],
                        self.tiers,
                        self.noise,
                        fit,
                        _z(1 - self.confidence),
                    )
                )
        # the configuration's cells re-bounded by its calibrated model; with unprobed_margin set, only those of a
        # prompt length it has probed (a 100k load-1 probe's calibration says little of a 3k prompt at 50 users:
        # the model's error there is its own), the others keep the unprobed bound
        if self.use_prior and self.calibrate_prior:
            if self.unprobed_margin is not None:
                probed = {self.group_of.get(r.shape) for r in self.records if r.config == c.config}
                mine_cells = [x for x in mine_cells if _fit_group(x.shape) in probed]
            self.kw["prior_high"].update(
                prior_bounds(
                    mine_cells,
                    self.tiers,
                    self.noise,
                    calibrated_margin(self.prior_margin, n_c),
                    {c.config: calibration(c.config, self.records)},
                )
            )

    def check_guess(self, ans: Answer, measure: Measure, check_guesses: float) -> bool:
        """A settled answer that leans on a guessed verdict that could change it: that probe goes on to
        check_guesses x its requests (its stream extended: a real run's top-up); False when there is none."""
        target = _guess_to_check(ans, self.cell_of, self.by_cell, self.kw.get("prior_value", {}), self.checked)
        if target is None:
            return False
        c, old = target
        self.checked.add((c.key, old.load))
        rec = self.probe(
            c,
            old.load,
            list(old.guessed),
            measure,
            max_requests=int(old.requests * check_guesses),
            max_probe_s=None,
            max_looks=self.max_looks + math.ceil(math.log2(check_guesses)),
            guess_extend=1.0,
        )
        rec.order = old.order
        if rec.measured_as is not None:  # a shared stream's probe costs what it added: the old one's and that
            rec.seconds += old.seconds
        self.records[self.records.index(old)] = rec
        self.by_cell[c.key][self.by_cell[c.key].index(old)] = rec
        self.seconds[c.config] += rec.seconds - old.seconds
        return True

    def result(self, rounds: int, budget_hit: bool) -> DecisionRun:
        final = self.answer(complete=not budget_hit)
        return DecisionRun(
            final, self.records, self.seconds, {k: self.gpus[k] for k in self.seconds}, rounds, budget_hit
        )


def run_decision(
    cells: Sequence[Cell],
    tier_texts: Mapping[str, Sequence[str]],
    measure: Measure,
    *,
    budget_gpu_s: float | None = None,
    max_rounds: int = 5000,
    check_guesses: float = 1.0,
    on_probe: Callable[[Answer], None] | None = None,
    on_record: Callable[[ProbeRecord, Answer], None] | None = None,
    stop: Callable[[], bool] | None = None,
    one_server: bool = False,
    **settings: Any,
) -> DecisionRun:
    """Decide every (shape, tier) question, one probe at a time: of the cells still contending in an open question,
    the one with the most chance of being an answer per predicted GPU-second (`Decider.work`); `measure(cell, load)`
    gives the probe's request stream; `settings`: the Decider's (confidence, resolution, the probe caps, the priors'
    switches: `use_prior`, `calibrate_prior`, `fit_prior`; `race=False` for measuring what racing saves). Stops
    when every question is settled or nothing more can be learned, or at `budget_gpu_s` or once `stop()` says so,
    checked before each probe (the answer is then labelled best-so-far); `on_record(record, answer)` sees each probe
    and the answer after it. `one_server`: one server at a time (a serial run): a cell of another configuration than
    the last probe's costs its server's start again (`Cell.start_s`), so the order prefers the running server."""
    dec = Decider(cells, tier_texts, **settings)
    budget_hit = False
    rounds = 0
    while rounds < max_rounds:
        ans = dec.answer()
        if check_guesses > 1 and dec.check_guess(ans, measure, check_guesses):
            rounds += 1
            continue
        running = dec.records[-1].config if one_server and dec.records else None
        work = dec.work(ans, running=running)
        if not work:
            break
        if (budget_gpu_s is not None and sum(r.seconds * r.gpus for r in dec.records) >= budget_gpu_s) or (
            stop is not None and stop()
        ):
            budget_hit = True
            break
        rounds += 1
        w = max(work, key=lambda x: x.score)
        load = dec.load_for(w)
        if load is None:
            continue
        rec = dec.probe(w.cell, load, w.want, measure)
        dec.add(rec, w.cell)
        if on_probe is not None or on_record is not None:
            now = dec.answer()
            if on_probe is not None:
                on_probe(now)
            if on_record is not None:
                on_record(rec, now)
    return dec.result(rounds, budget_hit)


def _guess_to_check(
    ans: Answer,
    cell_of: Mapping[tuple[str, str], Cell],
    by_cell: Mapping[tuple[str, str], Sequence[ProbeRecord]],
    prior_value: Mapping[tuple[tuple[str, str], str], float],
    checked: set[tuple[tuple[str, str], int]],
) -> tuple[Cell, ProbeRecord] | None:
    """The first guessed probe a settled answer leans on, not yet checked: the leader's, or a guessed fail of a
    configuration the step model values above the leader's lower bound."""
    for q in ans.questions:
        if not q.guessed or q.status not in ("decided", "tie") or q.best is None:
            continue
        bar = q.value.low if q.value is not None else 0.0
        for config in [q.best, *q.alive, *q.dropped]:
            key = (config, q.shape)
            for r in by_cell.get(key, []):
                if q.tier not in r.guessed or (key, r.load) in checked:
                    continue
                wrong_fail = r.verdicts.get(q.tier) == "fail" and prior_value.get((key, q.tier), 0.0) > bar
                if config == q.best or wrong_fail:
                    return cell_of[key], r
    return None


def _high(q: QuestionAnswer) -> float:
    """The question's best lower bound so far (what a rival must beat), from its leader."""
    return q.bar if q.bar > 0 else math.inf


def _width(b: Bounds, cell: Cell) -> float:
    lo, hi = b.bracket
    lo_v = lo if lo is not None else cell.lower
    hi_v = hi if hi is not None else cell.upper * 2
    return math.log(max(hi_v, lo_v + 1) / max(lo_v, 1))


def _predicted_probe_s(
    cell: Cell,
    mine: Sequence[ProbeRecord],
    overhead_s: float,
    one_user: Cell | None = None,
    skip_first_round: bool = False,
) -> float:
    """A probe's predicted seconds at the cell's highest load probed so far; at load 1, priced as the one-user
    stream's cell (`one_user`) whose requests it runs; a skipped first round runs on top."""
    load = max((r.load for r in mine), default=cell.lower)
    p = (one_user if load == 1 and one_user is not None else cell).predicted(load)
    burst = first_round(load, skip_first_round)
    return overhead_s + (max(40, 2 * load - burst) + burst) / max(p["throughput"], 1e-9)


# ---------------------------------------------------------------- where the value stops rising


def searched_cells(cells: Iterable[Cell], knee_margin: float | None) -> list[Cell]:
    """The cells as the decision searches them: each capped at `knee_margin` x its throughput knee (None: as
    given)."""
    return [knee_capped(c, knee_margin) for c in cells] if knee_margin else list(cells)


def knee_capped(cell: Cell, margin: float, flat: float = 0.02) -> Cell:
    """The cell with its search's highest load at `margin` x its knee: the lowest load whose predicted throughput is
    within `flat` of the throughput at its highest load. Above the knee the server runs no more requests at once
    (its KV pool holds no more: a 100k-token prompt on one GPU runs alone) and the load only queues, so a tier that
    only bounds decode speed holds at every load while the value (output tok/s at the capacity) stays the knee's:
    probing those loads costs a long-context probe each (12 min at 100k on one GPU) and cannot change the answer.
    The margin keeps room for a step model that puts the knee too low (its KV pool estimate too small); the
    exhaustive answer is unchanged (the same value above the knee)."""
    top = cell.predicted(cell.upper)["throughput"]
    if top <= 0:
        return cell
    knee = next(
        (ld for ld in range(cell.lower, cell.upper + 1) if cell.predicted(ld)["throughput"] >= (1 - flat) * top),
        cell.upper,
    )
    upper = min(cell.upper, max(cell.lower, int(math.ceil(margin * knee))))
    if upper == cell.upper:
        return cell
    return dataclasses.replace(cell, upper=upper, _cache=cell._cache)


# ---------------------------------------------------------------- one user: a load-1 probe shared by output lengths


@dataclass
class _Stream:
    """A source cell's one-user stream: its draw, the requests it has and what they cost."""

    draw: Callable[[int], Measured]
    n: int = 0
    seconds: float = 0.0


def one_user_sources(cells: Sequence[Cell]) -> dict[tuple[str, str], Cell]:
    """Each single-shot cell (synthetic prompts of one length) whose lowest load is 1 -> its configuration's cell of
    the same workload and prompt length with the shortest output (itself when it is that one): with one user on the
    server, a request's TTFT does not depend on how many tokens it will generate and its decode runs alone, so one
    stream of the cheapest output measures every output length at load 1 (the step model carries the decode over
    the longer context)."""
    groups: dict[tuple[str, str, int], list[Cell]] = {}
    for c in cells:
        if c.shape.kind == "synthetic" and c.lower == 1:
            groups.setdefault((c.config, c.shape.workload, c.shape.prompt), []).append(c)
    out = {}
    for group in groups.values():
        src = min(group, key=lambda c: c.shape.output)
        for c in group:
            out[c.key] = src
    return out


def one_user_derived(m: Measured, src: Cell, cell: Cell) -> Measured:
    """`src`'s one-user requests as `cell`'s: the same TTFTs, TPOT times the step model's ratio at load 1 (the
    longer output decodes over a longer context), each request's E2E its TTFT plus its TPOT over the target's
    decode (the model's decode time per TPOT: E2E - TTFT over TPOT); a failed request stays failed."""
    if src is cell:
        return Measured(m.ttft, m.tpot, m.e2e, m.output, m.seconds)
    ps, pt = src.predicted(1), cell.predicted(1)
    tpot = m.tpot * (pt["tpot"] / ps["tpot"])
    with np.errstate(invalid="ignore"):
        e2e = m.ttft + tpot * ((pt["e2e"] - pt["ttft"]) / pt["tpot"])
    e2e = e2e[np.isfinite(e2e)]
    if e2e.size < 2:  # nothing served (as matrix/decision_run.py's streams say it)
        e2e = np.full(2, 1e6)
    return Measured(m.ttft, tpot, e2e, cell.shape.output, m.seconds)


# ---------------------------------------------------------------- ground truth and the simulated measurement


def exhaustive(
    cells: Sequence[Cell], tier_texts: Mapping[str, Sequence[str]], noise: Noise
) -> dict[tuple[str, str], dict[str, float]]:
    """The exhaustive answer on a known model: every concurrency of every cell checked on the population values;
    {(shape, tier): {config: tok/s per GPU at its capacity (0: fails at lower)}}."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for name, texts in tier_texts.items():
        slos = parse_tier(list(texts))
        for c in cells:
            cap = capacity(c, slos, noise)
            v = 0.0 if cap is None else noise.throughput(c.predicted(cap), cap, c.shape.output) / c.gpus
            out.setdefault((c.shape.key, name), {})[c.config] = v
    return out


def simulated_measure(
    noise: Noise, truth: Mapping[tuple[str, str], Callable[[int], Prediction]], seed: int
) -> Measure:
    """Probes drawn from a known model (seeded): `truth[(config, shape)](load)` is the population's prediction;
    each probe's stream is one seeded draw that later looks extend."""

    def measure(cell: Cell, load: int, skip_first_round: bool = False) -> Callable[[int], Measured]:
        p = truth[cell.key](load)  # drawn from the steady population: no opening burst to skip
        rng = np.random.default_rng([seed, zlib.crc32("/".join(cell.key).encode()), load])
        stream: dict[str, np.ndarray] = {m: np.zeros(0) for m in ("ttft", "tpot", "e2e")}

        def draw(n: int) -> Measured:
            have = stream["ttft"].size
            if n > have:
                more = noise.draw(p, n - have, rng)
                for m in stream:
                    stream[m] = np.concatenate([stream[m], more[m]])
            return Measured(stream["ttft"][:n], stream["tpot"][:n], stream["e2e"][:n], cell.shape.output)

        return draw

    return measure


def agreement(
    decided: Mapping[tuple[str, str], str | None],
    truth: Mapping[tuple[str, str], Mapping[str, float]],
    resolution: float,
) -> dict[str, Any]:
    """How often the decision's best configuration is the exhaustive one: exactly, and within resolution (its true
    value at least best / (1 + resolution): a tie the resolution cannot tell apart); the misses, explained."""
    exact = within = 0
    misses = []
    for q, vals in truth.items():
        top = max(vals.values())
        best = max(vals, key=lambda k: vals[k]) if top > 0 else None
        got = decided.get(q)
        got_v = vals.get(got, 0.0) if got else 0.0
        if got == best:
            exact += 1
            within += 1
            continue
        tie = (top == 0 and got_v == 0) or (top > 0 and got_v * (1 + resolution) >= top)
        within += tie
        misses.append(
            {
                "question": q,
                "decided": got,
                "exhaustive": best,
                "decided_value": round(got_v, 2),
                "best_value": round(top, 2),
                "within_resolution": tie,
            }
        )
    n = max(1, len(truth))
    return {"questions": len(truth), "exact": exact / n, "within_resolution": within / n, "misses": misses}
