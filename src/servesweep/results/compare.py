"""Per-point samples of a run's records, and `servesweep compare runs/A runs/B [...]`.

Runs are read with servesweep.results.runfolder.load_run. Every number here is recomputed from `records.parquet`
with the definitions of docs/metrics.md; the point estimates equal `summary.summarize()`'s.

Comparing: for each pair of matching points (same configuration and load axes), each metric's change with a
bootstrap confidence interval. Requests are resampled with replacement, independently in both runs (seeded numpy,
1,000 resamples by default); pooled values (ITL gaps) follow the request they belong to. Throughput is resampled
through Little's law (mean concurrency × Σ tokens / Σ request time), which equals Σ tokens / window on the
observed sample. The verdict is direction-aware: "better"/"worse" when the interval excludes zero and the change is
at least `min_effect`; "within noise" when the change is smaller than `min_effect` and the interval says so too
(it excludes zero, or lies within ±min_effect); "not enough requests to tell" when the interval includes zero and
reaches past ±min_effect: the data allow both no change and a change the user cares about (4 requests a point
give intervals like [-95%, +1956%], which "within noise" would misreport as no change).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servesweep.config.slo import ENERGY, GOODPUT, MetricName, SLOError, metric_label, metric_name
from servesweep.exit_codes import BadOption
from servesweep.files import write_atomic
from servesweep.results import metrics
from servesweep.results.degeneration import degenerate_flags
from servesweep.results.degraded import degradation
from servesweep.results.diagnosis import Diagnosis, diagnose_all
from servesweep.results.energy import GPU_JSON, load_gpu
from servesweep.results.packing import is_isolation_sample, point_packing
from servesweep.results.pergpu import point_gpus, with_per_gpu_changes
from servesweep.results.runfolder import PointInfo, Run, RunError
from servesweep.results.runfolder import load_run as load_run  # the reader of the runs compared here

BOOTSTRAP_CAP = 200_000  # pooled values per resample (ITL gaps of long runs): every k-th of the sorted values

# ---------------------------------------------------------------- one point's records as arrays


@dataclass
class PointSample:
    """Per measured request (warmup excluded) arrays; NaN where a value does not apply (e.g. TTFT of a failure)."""

    ok: np.ndarray
    tokens: np.ndarray  # completion tokens of ok requests, 0 for failures
    busy_s: np.ndarray  # end - scheduled: the time the request held its user (Little's law)
    window_s: float
    per_request: dict[str, np.ndarray]  # ttft, e2e, tpot, ... in ms (decode_tokens_per_s in tok/s)
    pooled: dict[str, tuple[np.ndarray, np.ndarray]]  # itl, itl_per_token: (values, owning request index)
    max_itl: np.ndarray  # largest gap per request (ms), for per-request ITL SLOs
    cached: np.ndarray  # cached tokens where reported, NaN elsewhere
    prompt: np.ndarray  # prompt tokens from usage of ok requests, NaN elsewhere
    degenerate: np.ndarray | None = None  # 1 degenerate, 0 not, NaN not judged (results/degeneration.py)
    # the point's GPU energy, gpu.json's `total` (results/energy.py GpuTotal, as JSON); None: no sampler
    energy: dict[str, Any] | None = None

    _sorted: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return int(self.ok.size)

    def sorted_values(self, key: str, cap: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A per-request or pooled metric's values ascending, with the index of the request each belongs to
        (sorted once: a bootstrap resample only changes the requests' weights). With `cap`, at most about that
        many: every k-th of the sorted values, which keeps every quantile (for bootstrap resamples of millions of
        ITL gaps; observed values always use all of them)."""
        if cap is not None:
            vals, owner = self.sorted_values(key)
            step = -(-vals.size // cap)
            return (vals, owner) if step <= 1 else (vals[::step], owner[::step])
        if key not in self._sorted:
            if key in self.pooled:
                vals, owner = self.pooled[key]
            else:
                vals = self.per_request[key]
                owner = np.flatnonzero(~np.isnan(vals))
                vals = vals[owner]
            order = np.argsort(vals, kind="stable")
            self._sorted[key] = (vals[order], owner[order])
        return self._sorted[key]

    @classmethod
    def from_table(cls, table) -> PointSample:
        import pyarrow as pa

        if table.num_rows:
            warm = table.column("warmup").to_numpy(zero_copy_only=False).astype(bool)
            table = table.filter(pa.array(~warm))
        n = table.num_rows

        def col(name: str) -> np.ndarray:
            return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)

        ok = np.array([e is None for e in table.column("error_class").to_pylist()], dtype=bool)
        sched, end = col("scheduled_ns"), col("end_ns")
        completion = col("completion_tokens")
        rm = metrics.request_metrics(table, ok)
        window = max((np.nanmax(end) - np.nanmin(sched)) / 1e9, 1e-9) if n else math.nan
        return cls(
            ok=ok,
            tokens=np.where(ok & ~np.isnan(completion), completion, 0.0),
            busy_s=(end - sched) / 1e9,
            window_s=float(window),
            per_request={
                "ttft": rm.ttft_ms,
                "ttft_from_scheduled": rm.ttft_from_scheduled_ms,
                "e2e": rm.e2e_ms,
                "e2e_from_scheduled": rm.e2e_from_scheduled_ms,
                "tpot": rm.tpot_ms,
                "decode_tokens_per_s": rm.decode_tokens_per_s,
                "schedule_lag": rm.schedule_lag_ms,  # all measured requests (client overhead)
            },
            pooled={
                "itl": (rm.itl_ms, rm.itl_owner),
                "itl_per_token": (rm.itl_per_token_ms, rm.itl_per_token_owner),
            },
            max_itl=rm.max_itl_ms,
            cached=np.where(ok, col("cached_tokens"), np.nan),
            prompt=np.where(ok, col("prompt_tokens"), np.nan),
            degenerate=degenerate_flags(table, ok)[0],
        )


def point_sample(p: PointInfo) -> PointSample:
    """A point's measured requests as arrays (its records read once per PointInfo)."""
    if "sample" not in p.cache:
        if p.records_path is None or not p.records_path.is_file():
            raise RunError(f"point {p.point_id}: no records.parquet (status {p.status})")
        from servesweep.results.records import read_parquet

        try:
            table = read_parquet(p.records_path)
        except (OSError, ValueError) as e:
            raise RunError(f"point {p.point_id}: {e}") from None
        sample = PointSample.from_table(table)
        sample.energy = point_energy(p)
        p.cache["sample"] = sample
    return p.cache["sample"]


def point_energy(p: PointInfo) -> dict[str, Any] | None:
    """The point's gpu.json `total` (its GPUs' energy, J per token...), None where no GPU sampler measured it."""
    if p.dir is None:
        return None
    try:
        doc = load_gpu(p.dir)
    except (OSError, ValueError) as e:  # a damaged gpu.json: named, with its field
        raise RunError(f"point {p.point_id}: {e}") from None
    if doc is None or doc.total is None or doc.total.energy_j is None:
        return None
    return doc.total.model_dump(mode="json")


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """np.percentile(linear) of the array in which values[i] appears weights[i] times (values sorted ascending)."""
    cw = np.cumsum(weights)
    total = cw[-1] if cw.size else 0
    if total <= 0:
        return math.nan
    h = q / 100.0 * (total - 1)
    lo = math.floor(h)
    i = int(np.searchsorted(cw, lo, side="right"))
    j = int(np.searchsorted(cw, lo + 1, side="right")) if h > lo else i
    return float(values[i] + (h - lo) * (values[j] - values[i]))


# ---------------------------------------------------------------- metrics

# What compare shows by default: the columns of the tables people make.
DEFAULT_METRICS = (
    "output_tokens_per_s",
    "request_rate",
    "decode_tokens_per_s_mean",
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "itl_per_token_p50",
    "tpot_p50",
    "e2e_p50",
    "error_rate",
)


# What compare adds where both runs measured their GPUs (gpu.json): energy per output token and per token.
ENERGY_METRICS = ("joules_per_output_token", "joules_per_token", "output_tokens_per_joule", "power_avg_w")


def _has_energy(run: Run) -> bool:
    return any(p.dir is not None and (p.dir / GPU_JSON).is_file() for p in run.done_points())


@dataclass(frozen=True)
class Metric(MetricName):
    """A metric of config/slo.py's vocabulary, measured on a PointSample."""

    @property
    def label(self) -> str:
        """The name as tables print it, saying which ITL (`itl_p50 (per chunk)`; config/slo.py metric_label)."""
        return metric_label(self)

    def value(self, s: PointSample, w: np.ndarray | None = None, cap: int | None = None) -> float:
        """The metric on the sample, each request counted w[i] times (None: once, the observed value); `cap`
        thins pooled values for bootstrap resamples (see PointSample.sorted_values)."""
        if w is None:
            w = np.ones(s.n)
        if self.stat is None:
            return _scalar(self.base, s, w)
        vals, owner = s.sorted_values(self.base, cap)
        vw = w[owner]
        if vals.size == 0 or vw.sum() <= 0:
            return math.nan
        if self.stat == "mean":
            return float(np.dot(vals, vw) / vw.sum())
        present = np.flatnonzero(vw > 0)
        if self.stat == "min":
            return float(vals[present[0]])
        if self.stat == "max":
            return float(vals[present[-1]])
        return weighted_percentile(vals, vw, float(self.stat[1:]))


def _scalar(base: str, s: PointSample, w: np.ndarray) -> float:
    n = w.sum()
    if n <= 0:
        return math.nan
    # Little's law keeps the observed window's mean concurrency: on the observed sample this is exactly Σ/window.
    busy = float(np.dot(w, s.busy_s))
    conc = float(s.busy_s.sum() / s.window_s) if s.window_s > 0 else math.nan
    if base == "output_tokens_per_s":
        return conc * float(np.dot(w, s.tokens)) / busy if busy > 0 else math.nan
    if base == "request_rate":
        return conc * float(np.dot(w, s.ok)) / busy if busy > 0 else math.nan
    if base == "error_rate":
        return float(np.dot(w, ~s.ok)) / float(n)
    if base == "cache_hit_ratio":
        has = ~np.isnan(s.cached) & ~np.isnan(s.prompt)
        den = float(np.dot(w[has], s.prompt[has]))
        return float(np.dot(w[has], s.cached[has])) / den if has.any() and den > 0 else math.nan
    if base in ENERGY:
        return _energy(base, s, w)
    if base == "degenerate_rate":
        deg = s.degenerate
        if deg is None:  # not judged: no request counts
            return math.nan
        has = ~np.isnan(deg)
        den = float(w[has].sum())
        return float(np.dot(w[has], deg[has])) / den if den > 0 else math.nan
    raise KeyError(base)


def _token_rate(s: PointSample, w: np.ndarray, with_prompt: bool) -> float:
    """Tokens per second of the sample weighted by w (Little's law, as output_tokens_per_s): output tokens, or
    output + prompt tokens."""
    busy = float(np.dot(w, s.busy_s))
    conc = float(s.busy_s.sum() / s.window_s) if s.window_s > 0 else math.nan
    tok = s.tokens + (np.nan_to_num(s.prompt) if with_prompt else 0.0)
    return conc * float(np.dot(w, tok)) / busy if busy > 0 else math.nan


def _energy(base: str, s: PointSample, w: np.ndarray) -> float:
    """An ENERGY metric: the observed figure of gpu.json, and under a resample of the requests the same energy over
    the resample's tokens: the counter is one measurement (taken as exact), the point's token rate is what varies,
    so joules per token scale with observed / resampled token rate (tokens per joule the other way)."""
    obs = (s.energy or {}).get(base)
    if obs is None or not math.isfinite(float(obs)):
        return math.nan
    if base == "power_avg_w":
        return float(obs)
    with_prompt = base in ("joules_per_token", "tokens_per_joule")
    r_obs = _token_rate(s, np.ones(s.n), with_prompt)
    r_w = _token_rate(s, w, with_prompt)
    if not (r_obs > 0 and r_w > 0):
        return math.nan
    return float(obs) * (r_w / r_obs if base.endswith("per_joule") else r_obs / r_w)


def metric(name: str) -> Metric:
    """'ttft_p99' / 'ttft_p95' / 'output_tok_s' / 'error_rate' ... to a Metric; ValueError naming the name when
    unknown, or when it is goodput (which needs per-request SLOs: `servesweep gate`)."""
    m = metric_name(name, any_percentile=True)
    if m.base in GOODPUT:
        raise SLOError(f"metric {name!r} counts the requests that meet per-request SLOs; check it with --slo")
    return Metric(**asdict(m))


# ---------------------------------------------------------------- bootstrap comparison


@dataclass
class Change:
    metric: Metric
    a: float
    b: float
    delta: float  # relative (fraction) or absolute, by metric.relative
    ci: tuple[float, float]
    verdict: str  # better, worse, within noise, n/a

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric.name,
            "label": self.metric.label,
            "unit": self.metric.unit,
            "higher_is_better": self.metric.higher_is_better,
            "change_kind": "relative" if self.metric.relative else "absolute",
            "a": _clean(self.a),
            "b": _clean(self.b),
            "change": _clean(self.delta),
            "ci_low": _clean(self.ci[0]),
            "ci_high": _clean(self.ci[1]),
            "verdict": self.verdict,
        }


def _clean(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def _diff(m: Metric, a: np.ndarray | float, b: np.ndarray | float):
    if m.relative:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.asarray(b) - np.asarray(a)) / np.asarray(a)
    return np.asarray(b) - np.asarray(a)


def bootstrap_changes(
    sa: PointSample,
    sb: PointSample,
    metrics: list[Metric],
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    min_effect: float = 0.02,
) -> list[Change]:
    """Each metric's change from A to B with a percentile bootstrap interval (requests resampled in each run)."""
    rng = np.random.default_rng(seed)
    wa = rng.multinomial(sa.n, np.full(sa.n, 1.0 / sa.n), size=resamples) if sa.n else None
    wb = rng.multinomial(sb.n, np.full(sb.n, 1.0 / sb.n), size=resamples) if sb.n else None
    lo_q, hi_q = (1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100
    out = []
    for m in metrics:
        a, b = m.value(sa), m.value(sb)
        delta = float(_diff(m, a, b))
        if wa is None or wb is None or not (math.isfinite(a) and math.isfinite(b)):
            out.append(Change(m, a, b, delta, (math.nan, math.nan), "n/a"))
            continue
        ra = np.array([m.value(sa, w, BOOTSTRAP_CAP) for w in wa])
        rb = np.array([m.value(sb, w, BOOTSTRAP_CAP) for w in wb])
        d = _diff(m, ra, rb)
        d = d[np.isfinite(d)]
        if d.size < resamples // 2 or not math.isfinite(delta):
            out.append(Change(m, a, b, delta, (math.nan, math.nan), "n/a"))
            continue
        lo, hi = (float(x) for x in np.percentile(d, [lo_q, hi_q]))
        out.append(Change(m, a, b, delta, (lo, hi), verdict(m, delta, lo, hi, min_effect)))
    return out


BETTER, WORSE, NOISE, CANNOT_TELL, NA = (
    "better",
    "worse",
    "within noise",
    "not enough requests to tell",
    "n/a",
)
VERDICTS = (WORSE, BETTER, CANNOT_TELL, NOISE, NA)  # the summary line's order: what needs a look first


def verdict(m: Metric, delta: float, lo: float, hi: float, min_effect: float) -> str:
    if lo <= 0 <= hi:
        return CANNOT_TELL if max(-lo, hi) > min_effect else NOISE
    if abs(delta) < min_effect:
        return NOISE
    up = lo > 0
    return BETTER if up == m.higher_is_better else WORSE


@dataclass
class PointComparison:
    key: tuple
    a: PointInfo
    b: PointInfo
    changes: list[Change]
    why_a: Diagnosis | None = None  # each side's verdict (results/diagnosis.py), from its summary.json
    why_b: Diagnosis | None = None

    @property
    def cause_changed(self) -> bool:
        """Whether the two sides' first causes differ (a status like 'no limit reached' counts as one)."""
        return _first(self.why_a) != _first(self.why_b)

    @property
    def cause_line(self) -> str:
        """What changed in the verdict: `queueing → no limit reached (run: ...)`; the run side's evidence kept."""
        b = self.why_b.line if self.why_b is not None else "-"
        return f"{_first(self.why_a)} → {_first(self.why_b)} (run: {b})"

    @property
    def degraded(self) -> list[str]:
        """Which side ran at a lower load than asked ('baseline', 'run'): its changes compare another load."""
        return [side for side, p in (("baseline", self.a), ("run", self.b)) if is_degraded(p)]

    @property
    def label(self) -> str:
        """point_label, with `DEGRADED (run)` when a side was degraded."""
        return point_label(self.a) + (f" DEGRADED ({', '.join(self.degraded)})" if self.degraded else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "point_a": self.a.point_id,
            "point_b": self.b.point_id,
            "config_a": self.a.config_id,
            "config_b": self.b.config_id,
            "workload": self.a.workload,
            "prompt_tokens": self.a.prompt_tokens,
            "output_tokens": self.a.output_tokens,
            "concurrency": self.a.concurrency,
            "degraded": self.degraded,
            "changes": [c.as_dict() for c in self.changes],
            "why_a": self.why_a.as_dict() if self.why_a is not None else None,
            "why_b": self.why_b.as_dict() if self.why_b is not None else None,
            "cause_changed": self.cause_changed,
        }


def _first(d: Diagnosis | None) -> str:
    return "-" if d is None else (d.first or d.status)


def _verdicts(run: Run) -> dict[str, Diagnosis]:
    """Every done point's verdict, each against its configuration's lowest-load point."""
    done = [p for p in run.done_points() if isinstance(p.summary, dict)]
    return {p.point_id: d for p, d in zip(done, diagnose_all([p.summary or {} for p in done]), strict=True)}


@dataclass
class RunComparison:
    a: Run
    b: Run
    points: list[PointComparison]
    only_a: list[str]
    only_b: list[str]
    settings: dict[str, Any]

    def counts(self) -> dict[str, int]:
        """How many changes got each verdict, in VERDICTS order."""
        n = {v: 0 for v in VERDICTS}
        for pc in self.points:
            for c in pc.changes:
                n[c.verdict] += 1
        return n

    def summary_line(self) -> str:
        """The first line to read: `RUN vs baseline BASE: 12 points, 3 worse, 1 better, 40 not enough requests to
        tell, 76 within noise` (only the verdicts that occur)."""
        said = ", ".join(f"{k} {v}" for v, k in self.counts().items() if k)
        line = f"{self.b.run_id} vs baseline {self.a.run_id}: {len(self.points)} points" + (
            f", {said}" if said else ""
        )
        bad = [pc for pc in self.points if pc.degraded]
        if bad:
            line += (
                f"; {len(bad)} point(s) DEGRADED, measured at a lower load than asked, their changes compare "
                f"another load: {_few([pc.label for pc in bad], 3)}"
            )
        return line

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": str(self.a.path),
            "run": str(self.b.path),
            "summary": self.summary_line(),
            "counts": self.counts(),
            "settings": self.settings,
            "points": [p.as_dict() for p in self.points],
            "only_in_baseline": self.only_a,
            "only_in_run": self.only_b,
        }


def _match_key(run: Run, p: PointInfo) -> tuple:
    # Two runs of one configuration each (e.g. last month's and today's) match on the load axes alone.
    cfgs = {q.config_id for q in run.points}
    return ((p.config_id if len(cfgs) > 1 else ""), *p.axes)


def compare_runs(
    a: Run,
    b: Run,
    metrics: list[Metric] | None = None,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    min_effect: float = 0.02,
    per_gpu: bool = True,
) -> RunComparison:
    """Every matched point's changes; with `per_gpu`, output tok/s and req/s per GPU after their totals. By default
    (no `metrics`) the energy metrics follow (ENERGY_METRICS) where both runs have GPU telemetry."""
    if not metrics:
        metrics = [metric(n) for n in DEFAULT_METRICS]
        if _has_energy(a) and _has_energy(b):
            metrics += [metric(n) for n in ENERGY_METRICS]
    # a packed run's isolation sample (its points re-run alone) is for its own report, not a matrix point
    ka = {_match_key(a, p): p for p in a.done_points() if not is_isolation_sample(p.entry)}
    kb = {_match_key(b, p): p for p in b.done_points() if not is_isolation_sample(p.entry)}
    pts = []
    why_a, why_b = _verdicts(a), _verdicts(b)
    mixed = []  # pairs where one point ran packed next to other servers and the other alone
    for i, (k, pa) in enumerate(ka.items()):
        pb = kb.get(k)
        if pb is None:
            continue
        if (ma := point_packing(pa.entry)) != (mb := point_packing(pb.entry)):
            mixed.append(f"{pa.point_id} ({ma}) vs {pb.point_id} ({mb})")
        ch = bootstrap_changes(
            point_sample(pa),
            point_sample(pb),
            metrics,
            resamples=resamples,
            seed=seed + i,
            confidence=confidence,
            min_effect=min_effect,
        )
        ga, gb = (
            point_gpus(pa.summary, pa.config_id, a.manifest),
            point_gpus(pb.summary, pb.config_id, b.manifest),
        )
        ch = with_per_gpu_changes(ch, ga, gb, verdict, min_effect) if per_gpu else ch
        pts.append(PointComparison(k, pa, pb, ch, why_a.get(pa.point_id), why_b.get(pb.point_id)))
    return RunComparison(
        a,
        b,
        pts,
        only_a=[p.point_id for k, p in ka.items() if k not in kb],
        only_b=[p.point_id for k, p in kb.items() if k not in ka],
        settings={
            "resamples": resamples,
            "seed": seed,
            "confidence": confidence,
            "min_effect": min_effect,
            "metrics": [m.name for m in metrics],
            "packed_vs_alone": mixed,
        },
    )


# ---------------------------------------------------------------- output


def fmt_value(x: float | None, unit: str) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if unit == "ms":
        return f"{x / 1000:.3g} s" if x >= 10_000 else f"{x:.4g} ms"
    if unit == "ratio":
        return f"{x * 100:.3g}%"
    return f"{x:.4g} {unit}"


def fmt_change(c: Change) -> str:
    if not math.isfinite(c.delta):
        return "-"
    return f"{c.delta * 100:+.1f}%" if c.metric.relative else f"{c.delta * 100:+.2f} pp"


def fmt_ci(c: Change) -> str:
    lo, hi = c.ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    if c.metric.relative:
        return f"[{lo * 100:+.1f}%, {hi * 100:+.1f}%]"
    return f"[{lo * 100:+.2f}, {hi * 100:+.2f}] pp"


def is_degraded(p: PointInfo) -> bool:
    """A point measured at a lower load than asked (results/degraded.py)."""
    return degradation(p.summary) is not None


def point_label(p: PointInfo) -> str:
    cfg = f"{p.config_id} " if p.config_id else ""
    return f"{cfg}{p.workload} p{p.prompt_tokens} o{p.output_tokens} c{p.concurrency}"


def rich_table(rc: RunComparison):
    from rich.table import Table

    t = Table(title=f"{rc.b.run_id} vs baseline {rc.a.run_id}")
    for col in ("point", "metric", "baseline", "run", "change", "CI", "verdict"):
        # metric names and verdicts whole at any width (a CI log's 80 columns cut them to `output_…`)
        t.add_column(
            col,
            justify="left" if col in ("point", "metric", "verdict") else "right",
            no_wrap=col in ("metric", "verdict"),
            overflow="fold",
        )
    for pc in rc.points:
        for i, c in enumerate(pc.changes):
            t.add_row(
                (f"[bold red]{pc.label}[/]" if pc.degraded else pc.label) if i == 0 else "",
                c.metric.label,
                fmt_value(c.a, c.metric.unit),
                fmt_value(c.b, c.metric.unit),
                fmt_change(c),
                fmt_ci(c),
                f"[{COLORS[c.verdict]}]{c.verdict}[/]",
            )
        t.add_section()
    return t


COLORS = {BETTER: "green", WORSE: "red", NOISE: "dim", CANNOT_TELL: "yellow", NA: "yellow"}


def compact_lines(rc: RunComparison) -> list[str]:
    """`--compact`, for CI logs: the summary line, then one line per better or worse change; the rest only
    counted (the summary line has them)."""
    lines = [rc.summary_line()]
    for pc in rc.points:
        for c in pc.changes:
            if c.verdict in (BETTER, WORSE):
                lines.append(
                    f"  {c.verdict.upper()} {pc.label} {c.metric.label}: {fmt_value(c.a, c.metric.unit)} -> "
                    f"{fmt_value(c.b, c.metric.unit)} ({fmt_change(c)}, interval {fmt_ci(c)})"
                )
    return lines + cause_lines(rc)


def cause_lines(rc: RunComparison) -> list[str]:
    """One line per matched point whose verdict changed between the runs (results/diagnosis.py)."""
    return [f"  cause {pc.label}: {pc.cause_line}" for pc in rc.points if pc.cause_changed]


def compare_html_section(rcs: list[RunComparison]) -> str:
    """The comparison as an HTML fragment (used by `compare --html` and by the report)."""
    from servesweep.results.templates import render

    return render(
        "compare_section.html.j2",
        comparisons=rcs,
        fmt_value=fmt_value,
        fmt_change=fmt_change,
        fmt_ci=fmt_ci,
        point_label=point_label,
    )


def write_compare_html(rcs: list[RunComparison], out: Path) -> Path:
    from servesweep.results.templates import render

    html = render("page.html.j2", title="servesweep compare", banner=None, body=compare_html_section(rcs))
    write_atomic(Path(out), html, mode=0o666)  # a report is for reading (mkstemp makes files private)
    return Path(out)


def _few(ids: list[str], n: int = 6) -> str:
    if not ids:
        return "none"
    return ", ".join(ids[:n]) + (f" (+{len(ids) - n} more)" if len(ids) > n else "")


def parse_fraction(text: str, what: str) -> float:
    """'10%' -> 0.10, '0.1' -> 0.1; BadOption naming the option otherwise."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise BadOption(f"{text!r} is not a fraction like 10% or 0.1", what) from None
    if not (0 <= v < 10):
        raise BadOption(f"{text!r} is out of range", what)
    return v
