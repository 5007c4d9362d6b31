"""The SLO grammar: `servesweep load --slo`, the Locust form's `slo`, an experiment's `slo:` list and
`servesweep gate --slo` all read SLOs with `parse_slos`.

An expression is `METRIC OP VALUE[UNIT]`, several separated by commas:

- METRIC names a figure of docs/metrics.md: a latency-like metric with a statistic (`ttft_p99`, `itl_p50`,
  `tpot_mean`, `decode_tokens_per_s_p50`; LATENCIES × STATS), a scalar of the point (`output_tokens_per_s`,
  `request_rate`, `error_rate`, `cache_hit_ratio`, `degenerate_rate`; SCALARS) or goodput (`goodput_ratio`, `goodput_per_s`;
  GOODPUT), or the point's GPU energy (`joules_per_token`, `joules_per_output_token`, `output_tokens_per_joule`,
  `tokens_per_joule`, `power_avg_w`; ENERGY: from its gpu.json, docs/gpu-telemetry.md, where a GPU sampler ran).
  ALIASES holds the other spellings (`output_tok_s`, `output_tps`, `j_per_tok`, ...).
- `itl` is the gap between token-bearing chunks (ITL per chunk), `itl_per_token` each gap divided by the tokens of
  its chunk, once per token (ITL per token); QUALIFIERS holds the words every surface labels them with.
- A latency of PER_REQUEST without a statistic (`ttft<=2s`, `itl<=100ms` for the request's largest gap) is a
  per-request SLO: it says which requests are *good* for goodput and is no check by itself.
- OP is `<=`, `>=`, `<` or `>`.
- UNIT: `ms` or `s` for latencies (default ms); `%` or a fraction for ratios; `tok/s`, `req/s` (or `/s`) optionally
  for rates; `J/tok` (or `J`), `tok/J`, `W` (or `kW`) optionally for energy. An SLO's `value` is in its metric's
  unit: ms for latencies, a fraction for ratios, J per token, tokens per J, W.

A new metric is one row of LATENCIES or SCALARS (its unit and which direction is better); each place that measures
SLOs (results/summary.py, results/gates.py through results/compare.py, the web UI) then gives its value.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass


class SLOError(ValueError):
    """An SLO expression that cannot be read; the message quotes the expression and says what is wrong."""


@dataclass(frozen=True)
class Kind:
    """What a metric's values are: the unit (ms, tok/s, req/s, ratio), which direction is better, and whether a
    change is relative (% of the baseline) or absolute (a ratio from 0 has no relative change: percentage points)."""

    unit: str
    higher_is_better: bool
    relative: bool = True


# Per-request metrics, summarised with a statistic.
LATENCIES: dict[str, Kind] = {
    "ttft": Kind("ms", False),
    "ttft_from_scheduled": Kind("ms", False),
    "itl": Kind("ms", False),
    "itl_per_token": Kind("ms", False),
    "tpot": Kind("ms", False),
    "e2e": Kind("ms", False),
    "e2e_from_scheduled": Kind("ms", False),
    "schedule_lag": Kind("ms", False),
    "decode_tokens_per_s": Kind("tok/s", True),
}
# One value per point.
SCALARS: dict[str, Kind] = {
    "output_tokens_per_s": Kind("tok/s", True),
    "request_rate": Kind("req/s", True),
    "error_rate": Kind("ratio", False, relative=False),
    "cache_hit_ratio": Kind("ratio", True, relative=False),
    "degenerate_rate": Kind("ratio", False, relative=False),
}
# One value per point, counting the requests that meet every per-request SLO.
GOODPUT: dict[str, Kind] = {
    "goodput_ratio": Kind("ratio", True, relative=False),
    "goodput_per_s": Kind("req/s", True),
}
# One value per point from the GPUs' energy during it (gpu.json's `total`, results/energy.py); no per-request values,
# so compare's interval for them comes from the point's throughput (results/compare.py) and the counter is taken as
# exact (it agreed with integrated power within 0.6 % on the H200, BENCHMARKS.md).
ENERGY: dict[str, Kind] = {
    "joules_per_token": Kind("J/tok", False),
    "joules_per_output_token": Kind("J/tok", False),
    "joules_per_output_token_above_idle": Kind("J/tok", False),
    "output_tokens_per_joule": Kind("tok/J", True),
    "tokens_per_joule": Kind("tok/J", True),
    "power_avg_w": Kind("W", False),
}
ALIASES = {
    "output_tok_s": "output_tokens_per_s",
    "output_tps": "output_tokens_per_s",
    "tok_s": "output_tokens_per_s",
    "req_s": "request_rate",
    "decode_tok_s": "decode_tokens_per_s",
    "per_request_tok_s": "decode_tokens_per_s",
    "j_per_tok": "joules_per_token",
    "j_per_token": "joules_per_token",
    "j_per_output_token": "joules_per_output_token",
    "j_per_out_tok": "joules_per_output_token",
    "out_tok_per_j": "output_tokens_per_joule",
    "tok_per_j": "tokens_per_joule",
    "power_w": "power_avg_w",
    "avg_power_w": "power_avg_w",
}
# The two inter-token latencies (docs/metrics.md, "ITL: per chunk and per token"): every surface that shows one says
# which in its label, with these words (CLI table, report, compare, gate, exporter, Grafana, the Locust web UI).
ITL_PER_CHUNK, ITL_PER_TOKEN = "per chunk", "per token"
QUALIFIERS: dict[str, str] = {"itl": ITL_PER_CHUNK, "itl_per_token": ITL_PER_TOKEN}
STATS = ("p50", "p90", "p95", "p99", "mean", "min", "max")
# The latencies one request can be judged on (goodput), in ms; itl is the request's largest gap.
PER_REQUEST = ("ttft", "tpot", "e2e", "itl")
OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}  # scalars and numpy arrays

_EXPR = re.compile(
    r"^\s*(?P<name>[A-Za-z][A-Za-z0-9_.]*)\s*(?P<op><=|>=|<|>)\s*"
    r"(?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*"
    r"(?P<unit>ms|s|%|tok/s|req/s|/s|J/tok|tok/J|J|kW|W)?\s*$"
)
_RATE_UNITS = {
    "tok/s": (None, "tok/s"),
    "req/s": (None, "req/s", "/s"),
    "J/tok": (None, "J/tok", "J"),
    "tok/J": (None, "tok/J"),
    "W": (None, "W", "kW"),
}


@dataclass(frozen=True)
class MetricName:
    """A metric as named: canonical `name` (ttft_p99, output_tokens_per_s, or a bare latency `ttft` of a
    per-request SLO), its `base` (ttft, output_tokens_per_s), `stat` (p99, mean, ...; None for one value per point
    and for a per-request latency) and its Kind's fields."""

    name: str
    base: str
    stat: str | None
    unit: str
    higher_is_better: bool
    relative: bool


def _named(name: str, base: str, stat: str | None, kind: Kind) -> MetricName:
    return MetricName(name, base, stat, kind.unit, kind.higher_is_better, kind.relative)


def metric_name(text: str, *, any_percentile: bool = False) -> MetricName:
    """'ttft_p99' / 'output_tok_s' / 'error_rate' ... to a MetricName; SLOError naming it when unknown. Statistics
    are STATS; `any_percentile` also takes p0..p100 (p95, p99.9: `servesweep compare --metric`)."""
    raw = text.strip()
    n = ALIASES.get(raw, raw)
    for table in (SCALARS, GOODPUT, ENERGY):
        if n in table:
            return _named(n, n, None, table[n])
    base, _, stat = n.rpartition("_")
    base = ALIASES.get(base, base)
    if base in LATENCIES:
        if stat in STATS or (any_percentile and _is_percentile(stat)):
            return _named(f"{base}_{stat}", base, stat, LATENCIES[base])
        if stat.startswith("p"):
            also = " nor p0..p100" if any_percentile else ""
            raise SLOError(f"unknown metric {text!r}: {stat} is not one of {', '.join(STATS)}{also}")
    if n in LATENCIES:
        raise SLOError(f"metric {text!r} needs a statistic: {n}_p50, {n}_p99, {n}_mean, ...")
    known = sorted([*SCALARS, *GOODPUT, *ENERGY, *ALIASES, *(f"{b}_{'|'.join(STATS)}" for b in LATENCIES)])
    raise SLOError(f"unknown metric {text!r}; known: {', '.join(known)}")


def metric_label(m: MetricName) -> str:
    """The metric's name as compare and gate print it: `itl_p50 (per chunk)`, `itl_per_token_p50 (per token)`;
    other names as they are."""
    q = QUALIFIERS.get(m.base)
    if q is None or (m.stat is None and m.base in PER_REQUEST):
        return m.name if q is None else f"{m.name} (largest gap {q})"
    return f"{m.name} ({q})"


def _is_percentile(stat: str) -> bool:
    if not stat.startswith("p"):
        return False
    try:
        return 0 <= float(stat[1:]) <= 100
    except ValueError:
        return False


@dataclass(frozen=True)
class SLO:
    text: str
    metric: MetricName
    op: str
    value: float  # in the metric's unit: ms for latencies, a fraction for ratios

    @property
    def name(self) -> str:
        return self.metric.name

    @property
    def stat(self) -> str | None:
        return self.metric.stat

    @property
    def per_request(self) -> bool:
        """A per-request latency SLO (`ttft<=2s`): it decides which requests are good; no check by itself."""
        return self.metric.stat is None and self.metric.base in PER_REQUEST

    @property
    def goodput(self) -> bool:
        return self.metric.base in GOODPUT

    @property
    def energy(self) -> bool:
        """Judged on the point's GPU telemetry (gpu.json), not on its requests."""
        return self.metric.base in ENERGY

    def holds(self, x: float | None) -> bool:
        return x is not None and math.isfinite(x) and bool(OPS[self.op](x, self.value))

    def limit_text(self) -> str:
        return self.text.split(self.op, 1)[1].strip()


def parse_slo(text: str) -> SLO:
    """One expression to an SLO; SLOError naming the expression and what is wrong."""
    m = _EXPR.match(text)
    if not m:
        raise SLOError(
            f"SLO {text!r}: expected METRIC OP VALUE[UNIT], e.g. ttft_p99<=2s, error_rate<=1%, "
            "output_tok_s>=1200, itl_p50<=30ms (OP: <=, >=, <, >)"
        )
    name, op, num, unit = m["name"], m["op"], float(m["num"]), m["unit"]
    if name in PER_REQUEST:
        met = _named(name, name, None, LATENCIES[name])
    else:
        try:
            met = metric_name(name)
        except SLOError as e:
            raise SLOError(f"SLO {text!r}: {e}") from None
    return SLO(text.strip(), met, op, _in_unit(text, met, num, unit))


def _in_unit(text: str, met: MetricName, num: float, unit: str | None) -> float:
    """The limit in the metric's unit; SLOError for a unit the metric does not take."""
    if met.unit == "ms":
        if unit not in (None, "ms", "s"):
            raise SLOError(f"SLO {text!r}: {met.name} is a latency; give ms or s, not {unit}")
        return num * 1000 if unit == "s" else num
    if met.unit == "ratio":
        if unit == "%":
            return num / 100
        if unit in ("ms", "s"):
            raise SLOError(f"SLO {text!r}: {met.name} is not a latency; give % or a fraction")
        if unit is not None:
            raise SLOError(f"SLO {text!r}: a ratio takes % or a fraction, not {unit}")
        if not 0 <= num <= 1:
            raise SLOError(f"SLO {text!r}: {num:g} is not a fraction; write {num:g}% or {num / 100:g}")
        return num
    if unit not in _RATE_UNITS.get(met.unit, (None,)):
        what = "an energy figure" if met.base in ENERGY else "a rate"
        raise SLOError(f"SLO {text!r}: {what} in {met.unit} takes no unit {unit!r}")
    return num * 1000 if unit == "kW" else num


def parse_slos(spec: str | list[str] | tuple[str, ...] | None) -> list[SLO]:
    """'a,b' or ['a', 'b,c'] to SLOs; goodput without a per-request SLO is an error."""
    if not spec:
        return []
    items = [spec] if isinstance(spec, str) else list(spec)
    out = [parse_slo(part) for item in items for part in str(item).split(",") if part.strip()]
    if any(s.goodput for s in out) and not any(s.per_request for s in out):
        raise SLOError(
            "goodput_ratio / goodput_per_s need per-request SLOs that say which requests are good, "
            "e.g. --slo 'ttft<=2s' --slo 'tpot<=50ms' --slo 'goodput_ratio>=90%'"
        )
    return out
