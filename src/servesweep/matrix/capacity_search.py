"""Capacity at SLO: the largest load a server configuration carries while every SLO holds.

A pure module: the caller hands in `probe(load, requests) -> ProbeResult` (one measured load point: a concurrency
for a closed loop, a request rate for an open loop) and SLO tiers; `search()` decides which loads to measure and
how many requests each needs, and returns, per tier, the capacity with the bracket it ended in. Nothing here starts
a server or Locust; the orchestrator wires `probe` to `driver.point_run.run_point` (docs/capacity.md).

The method (docs/capacity.md has the why):
- geometric bracket from the planner's estimate (x2 on a pass, /2 on a fail) inside [lower, upper], then
  bisection (geometric midpoint under a relative resolution, arithmetic under an absolute step) until the bracket
  [last pass, first fail] is no wider than the resolution, or the budget (distinct probes or probe seconds) is spent;
- every probe is judged for every tier (one search serves all tiers, probes are reused);
- each SLO is judged on a bootstrap confidence interval of its statistic: pass or fail only when the interval is
  clear of the threshold, else the probe is topped up with more requests (doubling) up to a cap, where the point
  estimate decides and the probe says so (`at_cap`). A percentile pXX needs at least ceil(1 / (1 - XX/100))
  samples (p99: 100) before it is judged at all: below that the tail holds no observation.

Also here: per-GPU normalisation and the Pareto frontier of (throughput per GPU, per-user output speed).
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

# the per-GPU helpers are part of the search's API (re-exported; defined where the report can use them)
from servesweep.results.pergpu import gpu_count, normalised, per_gpu  # noqa: F401

Load = int | float  # a concurrency (closed loop), a request rate in req/s (open loop) or a trace's speed-up factor
Axis = Literal["concurrency", "rate", "speedup"]

OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
# Per-request values a statistic can be taken of ("itl" is pooled over every gap of every ok request).
PER_REQUEST_METRICS = (
    "ttft",
    "ttft_from_scheduled",
    "tpot",
    "e2e",
    "e2e_from_scheduled",
    "decode_tokens_per_s",
    "itl",
)
# One value per probe: aggregates over requests (rates use the probe's measurement window).
SCALAR_METRICS = ("error_rate", "output_tokens_per_s", "request_rate", "goodput_ratio", "goodput_per_s")
# Other spellings of the grammars in use (results/summary.py, config/slo.py).
ALIASES = {
    "output_tps": "output_tokens_per_s",
    "output_tok_s": "output_tokens_per_s",
    "tok_s": "output_tokens_per_s",
    "req_s": "request_rate",
    "decode_tok_s": "decode_tokens_per_s",
    "per_request_tok_s": "decode_tokens_per_s",
}
# A latency without a statistic says which requests are good (goodput); it is no check by itself.
PER_REQUEST_SLO = ("ttft", "tpot", "e2e", "itl")

MIN_SAMPLES = 20  # no statistic is judged on fewer values (a mean or a median of 5 requests decides nothing)
MIN_TAIL = 1  # pXX needs MIN_TAIL observations beyond it: n >= MIN_TAIL / (1 - XX/100)
Z = {0.90: 1.645, 0.95: 1.960, 0.99: 2.576}  # two-sided normal quantiles for the Wilson interval


# ---------------------------------------------------------------- SLOs (adapter)


@dataclass(frozen=True)
class Slo:
    """One SLO as this module judges it: `metric` (PER_REQUEST_METRICS or SCALAR_METRICS), `stat` (pNN, mean,
    min, max; None for a scalar, or for a per-request latency that only defines good requests), `op`, `value` (ms
    for latencies, tok/s or req/s for rates, a fraction for ratios) and the text it was written as."""

    text: str
    metric: str
    stat: str | None
    op: str
    value: float

    @property
    def per_request(self) -> bool:
        return self.stat is None and self.metric in PER_REQUEST_SLO

    @property
    def upper_limit(self) -> bool:
        """True for `<=`/`<` (the statistic must stay below the value)."""
        return self.op in ("<=", "<")

    def holds(self, x: float) -> bool:
        return math.isfinite(x) and bool(OPS[self.op](x, self.value))


def as_slo(obj: Any) -> Slo:
    """An already-parsed SLO of either grammar to a Slo: results/summary.py's (metric: str, stat, op, value) or
    config/slo.py's (metric: MetricName with .base and .stat, op, value); a Slo passes through."""
    if isinstance(obj, Slo):
        return obj
    metric = obj.metric if isinstance(obj.metric, str) else obj.metric.base
    metric = ALIASES.get(metric, metric)
    stat = getattr(obj, "stat", None)
    if metric not in PER_REQUEST_METRICS and metric not in SCALAR_METRICS:
        raise ValueError(f"SLO {obj.text!r}: {metric} is not measured by the capacity search")
    return Slo(obj.text, metric, stat, obj.op, float(obj.value))


def parse_tier(spec: str | Sequence[str]) -> list[Slo]:
    """SLO text in servesweep's grammar to Slos (config/slo.py's parser)."""
    from servesweep.config.slo import parse_slos

    return [as_slo(s) for s in parse_slos(spec if isinstance(spec, str) else list(spec))]


def _tier(slos: Iterable[Any]) -> tuple[Slo, ...]:
    out = tuple(as_slo(s) for s in slos)
    if not out:
        raise ValueError("a tier needs at least one SLO")
    if any(s.per_request for s in out) and not any(s.metric.startswith("goodput") for s in out):
        raise ValueError(
            f"tier {[s.text for s in out]}: per-request SLOs only say which requests are good; "
            "add goodput_ratio>=X% to judge them"
        )
    return out


def _checked(slos: Iterable[Slo]) -> list[Slo]:
    """The SLOs of a tier that are judged on a probe (per-request ones act through goodput)."""
    return [s for s in slos if not s.per_request]


def min_samples(slo: Slo) -> int:
    """Values a statistic needs before it is judged: MIN_SAMPLES, and for pXX enough that MIN_TAIL of them lie
    beyond it (p90: 20, p95: 20, p99: 100, p99.9: 1000)."""
    if slo.stat and slo.stat.startswith("p"):
        q = float(slo.stat[1:]) / 100.0
        if q < 1.0:
            return max(MIN_SAMPLES, math.ceil(MIN_TAIL / (1.0 - q) - 1e-9))
    return MIN_SAMPLES


# ---------------------------------------------------------------- one probe's measurements


@dataclass
class ProbeResult:
    """What one probe measured, per request (measured requests only: warm-up left out by the probe). Latencies
    in ms, NaN where a request has none (a failed request; a TPOT of a one-token answer). `itl_ms` pools every
    gap of every ok request, `itl_owner` the request index of each. `window_s`: the measurement window (rates);
    `wall_s`: what the probe cost, for a budget in seconds (None: the search times the call)."""

    ok: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    completion_tokens: np.ndarray
    window_s: float
    itl_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_owner: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ttft_from_scheduled_ms: np.ndarray | None = None
    e2e_from_scheduled_ms: np.ndarray | None = None
    wall_s: float | None = None

    @property
    def n(self) -> int:
        return int(self.ok.size)

    @property
    def decode_tokens_per_s(self) -> np.ndarray:
        """Per-request output speed: 1000 / TPOT (docs/metrics.md)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.tpot_ms > 0, 1000.0 / self.tpot_ms, np.nan)

    @property
    def max_itl_ms(self) -> np.ndarray:
        """Each request's largest gap (a per-request ITL SLO); 0 where it has none."""
        out = np.zeros(self.n)
        np.maximum.at(out, self.itl_owner, self.itl_ms)
        return out

    @property
    def output_tokens_per_s(self) -> float:
        return float(np.sum(np.where(self.ok, self.completion_tokens, 0)) / self.window_s)

    def values(self, metric: str) -> np.ndarray:
        """One value per request of a per-request metric (NaN where none)."""
        if metric == "decode_tokens_per_s":
            return self.decode_tokens_per_s
        if metric in ("ttft_from_scheduled", "e2e_from_scheduled"):
            v = getattr(self, metric + "_ms")
            return v if v is not None else getattr(self, metric.split("_")[0] + "_ms")
        return getattr(self, metric + "_ms")

    def merged(self, other: ProbeResult) -> ProbeResult:
        """Both probes' requests as one sample (the same load measured twice: a top-up); windows and costs add."""

        def cat(a, b):
            return None if a is None or b is None else np.concatenate([a, b])

        wall = None if self.wall_s is None or other.wall_s is None else self.wall_s + other.wall_s
        return ProbeResult(
            ok=np.concatenate([self.ok, other.ok]),
            ttft_ms=np.concatenate([self.ttft_ms, other.ttft_ms]),
            tpot_ms=np.concatenate([self.tpot_ms, other.tpot_ms]),
            e2e_ms=np.concatenate([self.e2e_ms, other.e2e_ms]),
            completion_tokens=np.concatenate([self.completion_tokens, other.completion_tokens]),
            window_s=self.window_s + other.window_s,
            itl_ms=np.concatenate([self.itl_ms, other.itl_ms]),
            itl_owner=np.concatenate([self.itl_owner, other.itl_owner + self.n]),
            ttft_from_scheduled_ms=cat(self.ttft_from_scheduled_ms, other.ttft_from_scheduled_ms),
            e2e_from_scheduled_ms=cat(self.e2e_from_scheduled_ms, other.e2e_from_scheduled_ms),
            wall_s=wall,
        )

    @classmethod
    def from_records(cls, table, wall_s: float | None = None) -> ProbeResult:
        """A point's records.parquet (pyarrow table) to a ProbeResult, with the definitions of docs/metrics.md
        (results/metrics.py): warm-up rows left out, ok = no error class, window = first schedule to last end."""
        import pyarrow as pa

        from servesweep.results import metrics

        warm = np.asarray(table.column("warmup").to_pylist(), dtype=bool)
        m = table.filter(pa.array(~warm))
        ok = np.array([e is None for e in m.column("error_class").to_pylist()], dtype=bool)
        rm = metrics.request_metrics(m, ok)
        sched = np.asarray(m.column("scheduled_ns").to_pylist(), dtype=np.float64)
        end = np.asarray(m.column("end_ns").to_pylist(), dtype=np.float64)
        window = max((end.max() - sched.min()) / 1e9, 1e-9) if m.num_rows else math.nan
        tokens = np.array([t or 0 for t in m.column("completion_tokens").to_pylist()], dtype=np.float64)
        return cls(
            ok=ok,
            ttft_ms=rm.ttft_ms,
            tpot_ms=rm.tpot_ms,
            e2e_ms=rm.e2e_ms,
            completion_tokens=tokens,
            window_s=window,
            itl_ms=rm.itl_ms,
            itl_owner=rm.itl_owner,
            ttft_from_scheduled_ms=rm.ttft_from_scheduled_ms,
            e2e_from_scheduled_ms=rm.e2e_from_scheduled_ms,
            wall_s=wall_s,
        )


# ---------------------------------------------------------------- judging one SLO on one probe


@dataclass(frozen=True)
class Judgement:
    """One SLO on one probe: the estimate, its confidence interval, the sample size, and the verdict: pass/fail
    when the interval is clear of the threshold, undecided otherwise (or when n < min_samples)."""

    slo: str
    estimate: float
    low: float
    high: float
    n: int
    verdict: Literal["pass", "fail", "undecided"]

    def breach(self, slo: Slo) -> float:
        """How far the estimate is past the threshold, relative to it (> 0: breached); for the binding SLO."""
        if not math.isfinite(self.estimate):
            return math.inf
        d = (self.estimate - slo.value) if slo.upper_limit else (slo.value - self.estimate)
        return d / abs(slo.value) if slo.value else d


def _stat(a: np.ndarray, stat: str, axis: int | None = None):
    if stat == "mean":
        return np.mean(a, axis=axis)
    if stat == "min":
        return np.min(a, axis=axis)
    if stat == "max":
        return np.max(a, axis=axis)
    return np.percentile(a, float(stat[1:]), axis=axis)


def _weighted_quantile(sorted_v: np.ndarray, w: np.ndarray, q: float) -> float:
    """The q-quantile (inverted CDF) of sorted values each counted w times."""
    cw = np.cumsum(w)
    if cw[-1] <= 0:
        return math.nan
    return float(sorted_v[min(np.searchsorted(cw, q * cw[-1]), sorted_v.size - 1)])


def _pooled_replicates(r: ProbeResult, stat: str, b: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of a statistic of the pooled ITL gaps, resampling requests (a request's gaps move
    together: they are correlated, so resampling gaps alone would understate the interval)."""
    order = np.argsort(r.itl_ms, kind="stable")
    v, owner = r.itl_ms[order], r.itl_owner[order]
    reps = np.empty(b)
    for i in range(b):
        w = np.bincount(rng.integers(0, r.n, r.n), minlength=r.n)[owner].astype(np.float64)
        if stat == "mean":
            reps[i] = float(np.dot(v, w) / w.sum()) if w.sum() else math.nan
        elif stat in ("min", "max"):
            present = np.flatnonzero(w)
            reps[i] = v[present[0 if stat == "min" else -1]] if present.size else math.nan
        else:
            reps[i] = _weighted_quantile(v, w, float(stat[1:]) / 100.0)
    return reps


def _order_statistic_interval(sorted_v: np.ndarray, q: float, confidence: float) -> tuple[float, float]:
    """Distribution-free interval of the q-quantile: [x_(l), x_(u)] with l, u the binomial(n, q) quantiles at
    (1 ± confidence) / 2. Where u would pass the largest value the upper bound is +inf: the sample cannot bound
    the quantile from above (p99 at 95 %: fewer than 367 values; every value below the threshold proves nothing).
    The bootstrap interval of a tail quantile never reaches past the sample's largest value, so it is too
    narrow there; this is the bound that holds."""
    n = sorted_v.size
    k = np.arange(n + 1)
    log_pmf = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1) for i in k])
        + k * math.log(max(q, 1e-300))
        + (n - k) * math.log(max(1.0 - q, 1e-300))
    )
    cdf = np.cumsum(np.exp(log_pmf - log_pmf.max()))
    cdf /= cdf[-1]
    alpha = (1.0 - confidence) / 2.0
    lo_i = int(np.searchsorted(cdf, alpha))  # P(Bin <= lo_i) >= alpha: x_(lo_i) sits below the quantile
    hi_i = int(np.searchsorted(cdf, 1.0 - alpha)) + 1  # x_(hi_i) (1-based) sits above it
    low = float(sorted_v[lo_i - 1]) if lo_i >= 1 else -math.inf
    high = float(sorted_v[hi_i - 1]) if hi_i <= n else math.inf
    return low, high


def _wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (sound at 0 and n, where a bootstrap interval collapses)."""
    z = Z.get(confidence, 1.96)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def _good(r: ProbeResult, per_request: Sequence[Slo]) -> np.ndarray:
    """Requests that succeeded and meet every per-request SLO (docs/metrics.md, goodput); NaN never meets one."""
    good = r.ok.copy()
    for s in per_request:
        v = r.max_itl_ms if s.metric == "itl" else r.values(s.metric)
        with np.errstate(invalid="ignore"):
            good &= np.isfinite(v) & OPS[s.op](np.nan_to_num(v, nan=np.inf), s.value)
    return good


def _proportion(slo: Slo, r: ProbeResult, tier: Sequence[Slo], cfg: SearchSpec) -> tuple[float, ...]:
    """error_rate / goodput_ratio: a share of the requests, with its Wilson interval."""
    if r.n == 0:
        return math.nan, math.nan, math.nan, 0
    hits = ~r.ok if slo.metric == "error_rate" else _good(r, [s for s in tier if s.per_request])
    k = int(np.count_nonzero(hits))
    return (k / r.n, *_wilson(k, r.n, cfg.confidence), r.n)


def _rate(slo: Slo, r: ProbeResult, tier: Sequence[Slo], cfg: SearchSpec, rng) -> tuple[float, ...]:
    """output_tokens_per_s / request_rate / goodput_per_s: a sum over requests per second of the window, with a
    bootstrap over requests (the window is held fixed)."""
    if slo.metric == "output_tokens_per_s":
        x = np.where(r.ok, r.completion_tokens, 0.0)
    elif slo.metric == "request_rate":
        x = r.ok.astype(np.float64)
    else:
        x = _good(r, [s for s in tier if s.per_request]).astype(np.float64)
    if r.n == 0:
        return math.nan, math.nan, math.nan, 0
    alpha = (1.0 - cfg.confidence) / 2.0
    reps = x[rng.integers(0, r.n, (cfg.bootstrap, r.n))].sum(axis=1) / r.window_s
    return (float(x.sum() / r.window_s), *np.quantile(reps, [alpha, 1 - alpha]), r.n)


def _statistic(slo: Slo, r: ProbeResult, cfg: SearchSpec, rng) -> tuple[float, ...]:
    """A statistic (pNN, mean, min, max) of a per-request metric, or of the pooled ITL gaps, with its percentile
    bootstrap interval."""
    stat = slo.stat or "max"
    alpha = (1.0 - cfg.confidence) / 2.0
    if slo.metric == "itl":
        if r.itl_ms.size == 0:
            return math.nan, math.nan, math.nan, 0
        reps = _pooled_replicates(r, stat, cfg.bootstrap_pooled, rng)
        low, high = np.nanquantile(reps, [alpha, 1 - alpha])
        return float(_stat(r.itl_ms, stat)), low, high, r.itl_ms.size
    v = r.values(slo.metric)
    v = v[np.isfinite(v)]  # ok requests that have the value
    if v.size == 0:
        return math.nan, math.nan, math.nan, 0
    reps = _stat(v[rng.integers(0, v.size, (cfg.bootstrap, v.size))], stat, axis=1)
    low, high = np.quantile(reps, [alpha, 1 - alpha])
    if stat.startswith("p"):  # widened to the distribution-free bounds, which hold in the tail
        os_low, os_high = _order_statistic_interval(np.sort(v), float(stat[1:]) / 100.0, cfg.confidence)
        low, high = min(low, os_low), max(high, os_high)
    return float(_stat(v, stat)), float(low), float(high), int(v.size)


def judge(slo: Slo, r: ProbeResult, tier: Sequence[Slo], cfg: SearchSpec, rng) -> Judgement:
    """The verdict of one SLO on one probe (per-request SLOs are judged through the tier's goodput SLO)."""
    if slo.metric in ("error_rate", "goodput_ratio"):
        est, lo, hi, n = _proportion(slo, r, tier, cfg)
    elif slo.metric in ("output_tokens_per_s", "request_rate", "goodput_per_s"):
        est, lo, hi, n = _rate(slo, r, tier, cfg, rng)
    else:
        est, lo, hi, n = _statistic(slo, r, cfg, rng)
    if not math.isfinite(est):  # nothing measured (every request failed): no load is carried here
        return Judgement(slo.text, est, lo, hi, int(n), "fail")
    worst, best = (hi, lo) if slo.upper_limit else (lo, hi)
    verdict: Literal["pass", "fail", "undecided"]
    if n < min_samples(slo):
        verdict = "undecided"
    elif slo.holds(worst):
        verdict = "pass"
    elif not slo.holds(best):
        verdict = "fail"
    else:
        verdict = "undecided"
    return Judgement(slo.text, float(est), float(lo), float(hi), int(n), verdict)


# ---------------------------------------------------------------- the search


@dataclass(frozen=True)
class SearchSpec:
    """How to search. `axis`: concurrency (integer loads, closed loop) or rate (req/s, open loop). `start`: the
    planner's estimate; [lower, upper]: the loads allowed. Resolution: the search stops when the bracket
    [pass, fail] is no wider than max(step, rel × pass) (concurrency: step ≥ 1). Budget: distinct loads probed
    (`max_probes`) and/or probe seconds (`max_seconds`). Statistics: `confidence` of the bootstrap interval with
    `bootstrap` resamples (`bootstrap_pooled` for pooled ITL, slower); the first measurement of a load asks for
    max(min_requests, min_samples of the tiers' SLOs, min_rounds × concurrency) requests, undecided probes double
    it up to `max_requests`."""

    axis: Axis
    start: Load
    lower: Load
    upper: Load
    rel: float = 0.05
    step: float = 0.0
    max_probes: int | None = None
    max_seconds: float | None = None
    confidence: float = 0.95
    bootstrap: int = 1000
    bootstrap_pooled: int = 300
    min_requests: int = MIN_SAMPLES
    max_requests: int = 800
    min_rounds: float = 2.0
    factor: float = 2.0
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.lower <= self.upper:
            raise ValueError(f"bounds [{self.lower}, {self.upper}]: need 0 < lower <= upper")
        if self.rel <= 0 and self.step <= 0 and self.axis != "concurrency":
            raise ValueError(f"a {self.axis} search needs a resolution: rel > 0 or step > 0")

    @property
    def integer(self) -> bool:
        return self.axis == "concurrency"

    def resolution(self, at: Load) -> float:
        """The bracket width that is fine enough at load `at`."""
        return max(self.step, self.rel * at, 1.0 if self.integer else 0.0)

    def clamp(self, x: float) -> Load:
        x = min(max(x, self.lower), self.upper)
        return int(round(x)) if self.integer else float(x)


def grid_points(spec: SearchSpec) -> list[Load]:
    """The grid a person would sweep over [lower, upper] at the search's resolution: each point one resolution
    above the last (so a grid, too, can only say the capacity lies between two neighbours)."""
    pts: list[Load] = [spec.clamp(spec.lower)]
    while pts[-1] < spec.upper:
        nxt = spec.clamp(pts[-1] + spec.resolution(pts[-1]))
        if nxt <= pts[-1]:
            break
        pts.append(nxt)
    return pts


@dataclass
class ProbeRecord:
    """One load measured: its merged result, how many calls and requests it took, what it cost, and each tier's
    verdict with every SLO's judgement. `at_cap`: some verdict was decided by the point estimate at max_requests."""

    load: Load
    result: ProbeResult
    calls: int
    seconds: float
    order: int  # 1 for the first load probed
    verdicts: dict[str, str] = field(default_factory=dict)
    judgements: dict[str, list[Judgement]] = field(default_factory=dict)
    at_cap: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "load": self.load,
            "requests": self.result.n,
            "calls": self.calls,
            "seconds": round(self.seconds, 3),
            "order": self.order,
            "at_cap": self.at_cap,
            "output_tokens_per_s": self.result.output_tokens_per_s,
            "verdicts": self.verdicts,
            "judgements": {t: [j.__dict__ for j in js] for t, js in self.judgements.items()},
        }


@dataclass
class TierResult:
    """One tier's answer. `capacity`: the last passing load (None: fails at `lower`); `bracket`: (last pass, first
    fail), None where not found inside the bounds; `binding`: the SLO furthest past its threshold at the failing
    end; `stop`: resolution | budget | upper_bound (passes at `upper`) | lower_bound (fails at `lower`);
    `probes_used`: distinct loads measured when the tier was settled."""

    name: str
    slos: list[str]
    capacity: Load | None
    bracket: tuple[Load | None, Load | None]
    binding: str | None
    stop: str
    probes_used: int
    at_capacity: list[Judgement] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["at_capacity"] = [j.__dict__ for j in self.at_capacity]
        return d


@dataclass
class SearchResult:
    axis: Axis
    tiers: dict[str, TierResult]
    probes: list[ProbeRecord]
    seconds: float
    grid_points: int  # the equivalent grid at the same resolution (grid_points(spec))
    nonmonotone: list[str] = field(default_factory=list)  # tiers that passed above a load where they failed

    @property
    def probes_used(self) -> int:
        return len(self.probes)

    @property
    def calls(self) -> int:
        return sum(p.calls for p in self.probes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "probes_used": self.probes_used,
            "calls": self.calls,
            "seconds": round(self.seconds, 3),
            "grid_points": self.grid_points,
            "nonmonotone": self.nonmonotone,
            "tiers": {k: t.as_dict() for k, t in self.tiers.items()},
            "probes": [p.as_dict() for p in self.probes],
        }


Probe = Callable[[Load, int], ProbeResult]


class _Search:
    """The state of one search: every probe so far, each tier's bracket derived from them."""

    def __init__(self, probe: Probe, tiers: Mapping[str, tuple[Slo, ...]], spec: SearchSpec):
        self.probe, self.tiers, self.spec = probe, tiers, spec
        self.rng = np.random.default_rng(spec.seed)
        self.records: dict[Load, ProbeRecord] = {}
        self.seconds = 0.0
        # tier -> (stop reason, probes used then, its bracket then): a settled tier's answer is frozen, so probes
        # taken later for other tiers cannot reopen it (a contradiction they show goes to `nonmonotone`)
        self.settled: dict[str, tuple[str, int, tuple[Load | None, Load | None]]] = {}
        need = max(min_samples(s) for slos in tiers.values() for s in slos)
        self.first_requests = max(spec.min_requests, need)

    # -- brackets

    def bracket(self, tier: str) -> tuple[Load | None, Load | None]:
        """(largest pass below the first fail, smallest fail): monotone in load by assumption; a pass above a
        fail is left out (conservative) and named in `nonmonotone`."""
        fails = [x for x, r in self.records.items() if r.verdicts[tier] == "fail"]
        hi = min(fails) if fails else None
        passes = [x for x, r in self.records.items() if r.verdicts[tier] == "pass" and (hi is None or x < hi)]
        return (max(passes) if passes else None), hi

    def stop_reason(self, tier: str) -> str | None:
        lo, hi = self.bracket(tier)
        s = self.spec
        if lo is not None and lo >= s.upper:
            return "upper_bound"
        if hi is not None and hi <= s.lower:
            return "lower_bound"
        if lo is not None and hi is not None and hi - lo <= s.resolution(lo) + 1e-12:
            return "resolution"
        return None

    def next_load(self, tier: str) -> Load:
        lo, hi = self.bracket(tier)
        s = self.spec
        if lo is None and hi is None:
            return s.clamp(s.start)
        if hi is None:
            assert lo is not None  # one side at least is known
            x = s.clamp(lo * s.factor)
            return x if x > lo else s.clamp(lo + 1)
        if lo is None:
            x = s.clamp(hi / s.factor)
            return x if x < hi else s.clamp(hi - 1)
        geometric = s.rel * lo >= max(s.step, 1.0 if s.integer else 0.0)
        mid = math.sqrt(lo * hi) if geometric else (lo + hi) / 2.0
        x = s.clamp(mid)
        if s.integer:  # strictly inside the bracket
            x = min(max(x, lo + 1), hi - 1)
        return x

    # -- measuring

    def out_of_budget(self) -> bool:
        s = self.spec
        return (s.max_probes is not None and len(self.records) >= s.max_probes) or (
            s.max_seconds is not None and self.seconds >= s.max_seconds
        )

    def _call(self, load: Load, requests: int) -> tuple[ProbeResult, float]:
        t0 = time.monotonic()
        r = self.probe(load, requests)
        cost = r.wall_s if r.wall_s is not None else time.monotonic() - t0
        self.seconds += cost
        return r, cost

    def measure(self, load: Load) -> ProbeRecord:
        """Probe a new load, topping it up while an open tier is undecided there, and judge it for every tier."""
        n = self.first_requests
        if self.spec.integer:
            n = max(n, math.ceil(self.spec.min_rounds * load))
        result, cost = self._call(load, n)
        rec = ProbeRecord(load, result, 1, cost, len(self.records) + 1)
        self.records[load] = rec
        self._judge(rec, at_cap=False)
        while self._undecided(rec):
            more = min(rec.result.n, self.spec.max_requests - rec.result.n)
            if more <= 0 or (self.spec.max_seconds is not None and self.seconds >= self.spec.max_seconds):
                self._judge(rec, at_cap=True)
                break
            extra, cost = self._call(load, more)
            rec.result, rec.calls, rec.seconds = rec.result.merged(extra), rec.calls + 1, rec.seconds + cost
            self._judge(rec, at_cap=False)
        return rec

    def _undecided(self, rec: ProbeRecord) -> bool:
        return any(rec.verdicts[t] == "undecided" for t in self.tiers if t not in self.settled)

    def _judge(self, rec: ProbeRecord, at_cap: bool) -> None:
        for name, slos in self.tiers.items():
            js = [judge(s, rec.result, slos, self.spec, self.rng) for s in _checked(slos)]
            rec.judgements[name] = js
            verdicts = {j.verdict for j in js}
            if "fail" in verdicts:
                rec.verdicts[name] = "fail"
            elif verdicts == {"pass"}:
                rec.verdicts[name] = "pass"
            elif at_cap:  # the point estimate decides; the record says so
                held = all(s.holds(j.estimate) for s, j in zip(_checked(slos), js, strict=True))
                rec.verdicts[name] = "pass" if held else "fail"
                rec.at_cap = True
            else:
                rec.verdicts[name] = "undecided"

    # -- the answer

    def tier_result(self, name: str) -> TierResult:
        slos = self.tiers[name]
        lo, hi = self.bracket(name)
        stop, used, (lo, hi) = self.settled.get(name, ("budget", len(self.records), (lo, hi)))
        binding = None
        if hi is not None:
            pairs = zip(_checked(slos), self.records[hi].judgements[name], strict=True)
            binding = max(pairs, key=lambda sj: sj[1].breach(sj[0]))[0].text
        return TierResult(
            name=name,
            slos=[s.text for s in slos],
            capacity=lo,
            bracket=(lo, hi),
            binding=binding,
            stop=stop,
            probes_used=used,
            at_capacity=list(self.records[lo].judgements[name]) if lo is not None else [],
        )

    def nonmonotone(self) -> list[str]:
        out = []
        for name in self.tiers:
            _, hi = self.bracket(name)
            above = [
                x for x, r in self.records.items() if hi is not None and x > hi and r.verdicts[name] == "pass"
            ]
            if above:
                out.append(f"{name}: passes at {sorted(above)} above a fail at {hi}")
        return out


def search(
    probe: Probe, tiers: Mapping[str, Iterable[Any]] | Sequence[Iterable[Any]], spec: SearchSpec
) -> SearchResult:
    """The capacity of every tier in one search. `probe(load, requests)` measures `requests` more requests at
    `load` (a concurrency: an int; a rate: a float) and returns them as a ProbeResult; called again at the same
    load when the first sample cannot decide. `tiers`: {name: SLOs} or a list (named tier1, tier2, ...); SLOs as
    Slo or parsed objects of servesweep's grammar (as_slo)."""
    named = tiers if isinstance(tiers, Mapping) else {f"tier{i + 1}": t for i, t in enumerate(tiers)}
    st = _Search(probe, {k: _tier(v) for k, v in named.items()}, spec)
    while True:
        for name in st.tiers:
            if name not in st.settled and (why := st.stop_reason(name)) is not None:
                st.settled[name] = (why, len(st.records), st.bracket(name))
        open_tiers = [t for t in st.tiers if t not in st.settled]
        if not open_tiers or st.out_of_budget():
            break
        load = st.next_load(open_tiers[0])
        if load in st.records:  # cannot happen with a monotone bracket; guard against a loop all the same
            st.settled[open_tiers[0]] = ("resolution", len(st.records), st.bracket(open_tiers[0]))
            continue
        st.measure(load)
    return SearchResult(
        axis=spec.axis,
        tiers={t: st.tier_result(t) for t in st.tiers},
        probes=sorted(st.records.values(), key=lambda r: r.order),
        seconds=st.seconds,
        grid_points=len(grid_points(spec)),
        nonmonotone=st.nonmonotone(),
    )


# ---------------------------------------------------------------- per GPU, and the frontier


@dataclass(frozen=True)
class FrontierPoint:
    """One configuration at one load: throughput per GPU against per-user output speed (median decode tok/s)."""

    config: str
    load: Load
    tokens_per_s_per_gpu: float
    user_tokens_per_s: float


def frontier_points(config: str, gpus: int, result: SearchResult) -> list[FrontierPoint]:
    """Every probe of a search as a frontier point (the probed loads trace the configuration's curve)."""
    out = []
    for p in result.probes:
        speed = p.result.decode_tokens_per_s
        speed = speed[np.isfinite(speed)]
        if speed.size:
            out.append(
                FrontierPoint(config, p.load, p.result.output_tokens_per_s / gpus, float(np.median(speed)))
            )
    return out


def pareto_frontier(points: Iterable[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point beats on both throughput per GPU and per-user speed (higher is better on both;
    of exact duplicates the first is kept), from the highest throughput to the highest per-user speed."""
    ordered = sorted(points, key=lambda p: (-p.tokens_per_s_per_gpu, -p.user_tokens_per_s))
    out: list[FrontierPoint] = []
    for p in ordered:
        if not out or p.user_tokens_per_s > out[-1].user_tokens_per_s:
            out.append(p)
    return out
