"""CI gates: `servesweep gate runs/<id> --slo 'ttft_p99<=2s' --baseline runs/X --max-regression 10%`.

SLO expressions are those of servesweep.config.slo (`ttft_p99<=2s`, `error_rate<=1%`, per-request `ttft<=2s`
for goodput_ratio / goodput_per_s). Every value is computed from records.parquet.

Regression limits use compare's verdicts: a metric breaches when compare calls it "worse" (its bootstrap interval
excludes zero) and its change is beyond the limit (relative; error rate in percentage points).

Exit codes (servesweep.exit_codes, the same as `load`, `run` and headless Locust): 0 pass, 1 breach, 2 could not
run (bad expression, missing or unreadable run folder, nothing to check, a point not measured, or a degraded point:
measured at a lower load than asked, results/degraded.py; --allow-degraded accepts it), 3 too many failed requests
(a point with no success, or a failed share above the max failure rate the point was measured with, or
--max-failure-rate). When several hold, the one that says least was measured wins: 2, then 3, then 1.
`evaluate_records(records, slos)` gives the same verdict for one set of records (the Locust side at the end of a
headless run).
"""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.config.point import DEFAULT_MAX_FAILURE_RATE
from servesweep.config.slo import SLO, SLOError, metric_label, parse_slos
from servesweep.exit_codes import BREACH, COULD_NOT_RUN, FAILED_REQUESTS, PASS, BadOption
from servesweep.results import metrics
from servesweep.results.compare import (
    Metric,
    PointSample,
    _few,
    compare_runs,
    fmt_value,
    metric,
    parse_fraction,
    point_sample,
)
from servesweep.results.degraded import ALLOW_HINT, degradation
from servesweep.results.runfolder import PointInfo, Run, RunError, load_run

ERROR = COULD_NOT_RUN  # the gate's name for it (servesweep.exit_codes: one table for load, run, gate, Locust)
# Regression limits apply to central values by default: with CI-sized runs a p99 rests on a handful of requests,
# and one scheduling hiccup of the machine moves it. Tails are gated with SLOs or --regression-metric ttft_p99.
REGRESSION_METRICS = (
    "output_tokens_per_s",
    "decode_tokens_per_s_mean",
    "ttft_p50",
    "itl_p50",
    "tpot_p50",
    "e2e_p50",
    "error_rate",
)


class GateError(ValueError):
    """The gate cannot run (exit 2); the message names what is wrong."""


class Unset:
    """No value given (None means something: no share check)."""


UNSET = Unset()


# ---------------------------------------------------------------- evaluation


@dataclass
class CheckResult:
    point: str
    check: str
    # slo, regression, capacity; status (a point not measured), degraded (a point measured at a lower load than
    # asked): exit 2 when failed; failures (the point's failed share above its max failure rate): exit 3
    kind: str
    passed: bool | None  # None: skipped (an infeasible point, a point the baseline lacks)
    value: str = ""
    message: str = ""
    why: str = ""  # a breached point's verdict (results/diagnosis.py): its first cause and the evidence


@dataclass
class Verdict:
    results: list[CheckResult]
    subject: str
    error: str | None = None
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def breaches(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is False]

    @property
    def checked(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is not None]

    def _failed(self, kind: str) -> list[CheckResult]:
        return [r for r in self.breaches if r.kind == kind]

    @property
    def degraded(self) -> list[CheckResult]:
        """The degraded points not allowed: the run could not measure them as asked (exit 2)."""
        return self._failed("degraded")

    @property
    def not_measured(self) -> list[CheckResult]:
        """The points the run did not measure (failed, server_failed, pending, interrupted): exit 2, as `run`."""
        return self._failed("status")

    @property
    def failed_requests(self) -> list[CheckResult]:
        """The points whose failure check failed: no success, or a failed share above the limit (exit 3)."""
        return self._failed("failures")

    @property
    def passed(self) -> bool:
        return self.error is None and not self.breaches

    @property
    def exit_code(self) -> int:
        # the one that says least was measured wins (servesweep.exit_codes): not measured as asked (2), then too
        # many failed requests (3: the latencies of the rest mean little), then a breach (1)
        if self.error is not None or self.degraded or self.not_measured:
            return ERROR
        if self.failed_requests:
            return FAILED_REQUESTS
        return BREACH if self.breaches else PASS

    @property
    def verdict(self) -> str:
        """pass, breach, failed (requests), degraded, not measured or error: the word of the exit code."""
        if self.error is None and self.degraded:
            return "degraded"
        if self.error is None and self.not_measured:
            return "not measured"
        return {PASS: "pass", BREACH: "breach", FAILED_REQUESTS: "failed", ERROR: "error"}[self.exit_code]

    def _headline(self, word: str, group: list[CheckResult], what: str) -> str:
        """`WORD subject: N point(s) <what>; besides, k of n checks failed — the first three`."""
        shown = "; ".join(f"{r.point} {r.message}" for r in group[:3])
        more = f"; +{len(group) - 3} more" if len(group) > 3 else ""
        others = len(self.breaches) - len(group)
        also = f"; besides, {others} of {len(self.checked)} checks failed" if others else ""
        return f"{word} {self.subject}: {len(group)} point(s) {what}{also} — {shown}{more}"

    @property
    def line(self) -> str:
        """The one-line verdict."""
        if self.error is not None:
            return f"ERROR {self.subject}: {self.error}"
        if self.degraded:
            what = (
                "measured at a lower load than asked, their figures are not the asked load "
                f"({ALLOW_HINT.replace('RUN ', '')})"
            )
            return self._headline("DEGRADED", self.degraded, what)
        if self.not_measured:
            return self._headline(
                "NOT MEASURED", self.not_measured, "not measured (the run could not run them)"
            )
        if self.failed_requests:
            what = "with too many failed requests (their latencies mean little)"
            return self._headline("FAILED", self.failed_requests, what)
        allowed = [r for r in self.results if r.kind == "degraded" and r.passed]
        n = len(self.checked)
        skipped = len(self.results) - n
        tail = f", {skipped} skipped" if skipped else ""
        if allowed:
            tail += f" ({len(allowed)} degraded point(s) allowed: {', '.join(r.point for r in allowed[:5])})"
        if not self.breaches:
            return f"PASS {self.subject}: {n} checks passed{tail}"
        shown = "; ".join(f"{r.point} {r.message}" for r in self.breaches[:3])
        more = f"; +{len(self.breaches) - 3} more" if len(self.breaches) > 3 else ""
        return f"BREACH {self.subject}: {len(self.breaches)} of {n} checks failed{tail} — {shown}{more}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "line": self.line,
            "subject": self.subject,
            "error": self.error,
            **self.context,
            "checks": [r.__dict__ for r in self.results],
        }

    def write_junit(self, path: str | Path) -> Path:
        """JUnit XML: one testcase per point × check (classname = point, name = check)."""
        path = Path(path)
        suite = ET.Element(
            "testsuite",
            name=f"servesweep gate {self.subject}",
            tests=str(len(self.results) + (1 if self.error else 0)),
            failures=str(len(self.breaches)),
            errors="1" if self.error else "0",
            skipped=str(len(self.results) - len(self.checked)),
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
        )
        props = ET.SubElement(suite, "properties")
        for k, v in self.context.items():
            ET.SubElement(
                props, "property", name=str(k), value=json.dumps(v) if not isinstance(v, str) else v
            )
        if self.error:
            tc = ET.SubElement(suite, "testcase", classname=self.subject, name="gate", time="0")
            ET.SubElement(tc, "error", message=self.error, type="could not run").text = self.error
        for r in self.results:
            tc = ET.SubElement(suite, "testcase", classname=r.point, name=r.check, time="0")
            if r.passed is False:
                text = r.message + (f"\nwhy: {r.why}" if r.why else "")
                ET.SubElement(tc, "failure", message=r.message, type=r.kind).text = text
            elif r.passed is None:
                ET.SubElement(tc, "skipped", message=r.message)
            elif r.value:
                ET.SubElement(tc, "system-out").text = r.message
        root = ET.Element("testsuites", name="servesweep gate")
        root.append(suite)
        for k in ("tests", "failures", "errors", "skipped"):
            root.set(k, suite.attrib[k])
        ET.indent(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
        return path


def _goodput(s: PointSample, per_request: list[SLO]) -> tuple[float, float]:
    """(ratio of measured requests that are good, good per second of the window), docs/metrics.md."""
    values = {
        "ttft": s.per_request["ttft"],
        "e2e": s.per_request["e2e"],
        "tpot": s.per_request["tpot"],
        "itl": s.max_itl,
    }
    good = metrics.good_requests(values, s.ok, [(slo.name, slo.op, slo.value) for slo in per_request])
    if s.n == 0:
        return math.nan, math.nan
    return float(good.sum()) / s.n, float(good.sum()) / s.window_s


def slo_value(s: PointSample, slo: SLO, per_request: list[SLO]) -> float:
    if slo.goodput:
        ratio, per_s = _goodput(s, per_request)
        return ratio if slo.name == "goodput_ratio" else per_s
    return metric(slo.name).value(s)


def check_sample(point: str, s: PointSample, slos: list[SLO]) -> list[CheckResult]:
    per_request = [x for x in slos if x.per_request]
    out = []
    for slo in slos:
        if slo.per_request:
            continue  # shapes goodput; not a pass/fail by itself (docs/metrics.md)
        x = slo_value(s, slo, per_request)
        ok = slo.holds(x)
        shown = fmt_value(x, slo.metric.unit)
        label = metric_label(slo.metric)  # itl_p50 (per chunk), itl_per_token_p50 (per token)
        msg = f"{label} = {shown} ({'within' if ok else 'breaks'} {slo.op} {slo.limit_text()})"
        if not math.isfinite(x):
            msg = (
                f"{label} has no value (no GPU telemetry for this point: its gpu.json needs a GPU sampler, "
                "docs/gpu-telemetry.md)"
                if slo.energy
                else f"{label} has no value (no successful request to measure it on)"
            )
        out.append(CheckResult(point, slo.text, "slo", ok, shown, msg))
    return out


def evaluate_records(records, slos, *, name: str = "records") -> Verdict:
    """The gate for one set of per-request records: a pyarrow Table, a records.parquet path, or a list of rows.
    `slos`: 'ttft_p99<=2s,error_rate<=1%' or a list of expressions. Raises GateError on a bad expression."""
    import pyarrow as pa

    from servesweep.results.records import read_parquet, to_table

    try:
        parsed = parse_slos(slos)
    except SLOError as e:
        raise GateError(str(e)) from None
    if not any(not s.per_request for s in parsed):
        raise GateError(f"nothing to check in {slos!r}: give at least one aggregate SLO (e.g. ttft_p99<=2s)")
    if isinstance(records, str | Path):
        table = read_parquet(Path(records))
    elif isinstance(records, pa.Table):
        table = records
    else:
        table = to_table(records)
    s = PointSample.from_table(table)
    return Verdict(check_sample(name, s, parsed), name, context={"slos": [x.text for x in parsed]})


def experiment_slos(run: Run) -> list[str]:
    """The SLOs the run was made with: the experiment's `slo:` list, else those `servesweep load --slo` recorded."""
    exp = list((run.manifest.get("experiment") or {}).get("slo") or [])
    if exp:
        return exp
    seen: dict[str, None] = {}
    for p in run.points:
        for s in (p.summary or {}).get("slos") or []:
            seen.setdefault(s["slo"])
    return list(seen)


def evaluate_run(
    run: Run,
    slos: list[SLO],
    *,
    baseline: Run | None = None,
    max_regression: float = 0.10,
    regression_metrics: list[Metric] | None = None,
    resamples: int = 1000,
    seed: int = 0,
    allow_degraded: bool = False,
    max_failure_rate: float | None | Unset = UNSET,
) -> Verdict:
    """Every check of a run: each point measured, not degraded, its failure check, its SLOs; the regressions
    against `baseline`. `max_failure_rate`: the failure check's limit for every point (None: no share check);
    by default each point's own (failure_limit)."""
    results: list[CheckResult] = []
    for p in run.points:
        if p.status == "infeasible":
            results.append(CheckResult(p.point_id, "measured", "status", None, "", f"infeasible: {p.reason}"))
            continue
        if p.status != "done":
            why = f"point {p.status}" + (f": {p.reason}" if p.reason else "")
            results.append(CheckResult(p.point_id, "measured", "status", False, p.status, why[:500]))
            continue
        results += degraded_check(p, allow_degraded)
        try:
            sample = point_sample(p)
            if not (p.entry or {}).get("search") and not (p.entry or {}).get("decide"):
                limit = failure_limit(run, p) if isinstance(max_failure_rate, Unset) else max_failure_rate
                results += failure_check(p, sample, limit)
            results += check_sample(p.point_id, sample, slos)
        except RunError as e:
            raise GateError(str(e)) from None
    ctx: dict[str, Any] = {
        "run": str(run.path),
        "slos": [s.text for s in slos],
        "allow_degraded": allow_degraded,
    }
    if not isinstance(max_failure_rate, Unset):
        ctx["max_failure_rate"] = max_failure_rate
    if baseline is not None:
        mets = regression_metrics or [metric(n) for n in REGRESSION_METRICS]
        # per GPU left out: with one GPU count on both sides it would repeat each total's check
        rc = compare_runs(baseline, run, mets, resamples=resamples, seed=seed, per_gpu=False)
        if not rc.points:
            raise GateError(
                f"no point of {run.path} matches one of the baseline {baseline.path} "
                f"(baseline: {_few(rc.only_a)}; run: {_few(rc.only_b)})"
            )
        lim = max_regression * 100
        for pc in rc.points:
            for c in pc.changes:
                m = c.metric
                worse_by = c.delta if not m.higher_is_better else -c.delta
                kind = "%" if m.relative else " pp"
                check = f"{m.name} regression <= {lim:g}{kind} vs {baseline.run_id}"
                shown = f"{c.delta * 100:+.1f}{kind}" if math.isfinite(c.delta) else "-"
                breach = c.verdict == "worse" and worse_by > max_regression
                msg = (
                    f"{m.label} {shown} vs baseline ({fmt_value(c.a, m.unit)} → {fmt_value(c.b, m.unit)}, "
                    f"interval [{c.ci[0] * 100:+.1f}, {c.ci[1] * 100:+.1f}]{kind}: {c.verdict}; limit {lim:g}{kind})"
                )
                results.append(CheckResult(pc.b.point_id, check, "regression", not breach, shown, msg))
        for pid in rc.only_a:
            results.append(
                CheckResult(pid, "in baseline", "regression", None, "", "the run has no matching point")
            )
        ctx.update(baseline=str(baseline.path), max_regression=max_regression)
    ctx["why"] = explain_breaches(run, results)
    return Verdict(results, run.run_id, context=ctx)


def explain_breaches(run: Run, results: list[CheckResult]) -> dict[str, str]:
    """Each breached point's verdict (results/diagnosis.py, from its summary.json), set on its failed checks:
    {point_id: the verdict line}."""
    from servesweep.results.diagnosis import diagnose_all

    failed = {r.point for r in results if r.passed is False}
    done = [p for p in run.points if p.status == "done" and isinstance(p.summary, dict)]
    lines = {
        p.point_id: d.line
        for p, d in zip(done, diagnose_all([p.summary or {} for p in done]), strict=True)
        if p.point_id in failed
    }
    for r in results:
        if r.passed is False and r.point in lines:
            r.why = lines[r.point]
    return lines


def degraded_check(p: PointInfo, allowed: bool) -> list[CheckResult]:
    """A degraded point's check `not degraded`: failed (exit 2) unless `allowed`, said either way; none for a
    point that ran as asked (its other checks are made in both cases: a breach is still a breach)."""
    d = degradation(p.summary, p.records_path)
    if d is None:
        return []
    msg = ("degraded, allowed by --allow-degraded: " if allowed else "degraded: ") + d.text
    return [CheckResult(p.point_id, "not degraded", "degraded", allowed, d.short, msg[:1000])]


def failure_limit(run: Run, p: PointInfo) -> float | None:
    """The max failure rate a point was measured with: its summary's failure check (`servesweep load
    --max-failure-rate`, the experiment's `load.max_failure_rate`), else the experiment's, else the default (1%, as
    for a bare Locust records file)."""
    fc = (p.summary or {}).get("failure_check")
    if isinstance(fc, dict) and "max_failure_rate" in fc:
        return fc["max_failure_rate"]
    exp = ((run.manifest.get("experiment") or {}).get("load") or {}).get("max_failure_rate")
    return float(exp) if isinstance(exp, int | float) else DEFAULT_MAX_FAILURE_RATE


def failure_check(p: PointInfo, s: PointSample, max_failure_rate: float | None) -> list[CheckResult]:
    """The failure check of `servesweep load` and `run` (exit 3), on the point's records: none of its measured
    requests succeeded, or their failed share is above `max_failure_rate` (None: no share check). A check only
    where it fails, as for degraded points (the run's own stderr says any failure within the limit)."""
    measured, ok = s.n, int(s.ok.sum())
    failed = measured - ok
    limit = "no max failure rate" if max_failure_rate is None else f"max failure rate {max_failure_rate:.1%}"
    if ok == 0:
        msg = f"0 of {measured} measured requests succeeded"
    elif max_failure_rate is not None and failed / measured > max_failure_rate:
        msg = f"{failed} of {measured} requests failed ({failed / measured:.1%} > {limit})"
    else:
        return []
    if failed and p.records_path is not None:
        msg += _top_error(p.records_path, measured)
    check = "failed share <= " + ("-" if max_failure_rate is None else f"{max_failure_rate:.1%}")
    return [CheckResult(p.point_id, check, "failures", False, f"{failed}/{measured}", msg)]


def _top_error(records: Path, measured: int) -> str:
    """`; top error class http_5xx (7 of 10)`: the most frequent error class of the measured requests."""
    from collections import Counter

    import pyarrow.parquet as pq

    t = pq.read_table(records, columns=["warmup", "error_class"]).to_pydict()
    n = Counter(e for w, e in zip(t["warmup"], t["error_class"], strict=True) if e is not None and not w)
    if not n:
        return ""
    cls, k = n.most_common(1)[0]
    return f"; top error class {cls} ({k} of {measured})"


def parse_share(text: str, what: str) -> float:
    """'5%' or '0.05' -> 0.05, within 0 and 1; BadOption naming the option otherwise."""
    v = parse_fraction(text, what)
    if v > 1:
        raise BadOption(f"{text!r} is not a share between 0 and 1 (or 0% and 100%)", what)
    return v


def capacity_checks(run_dir: Path, min_capacity: str, baseline: Path | None) -> list[CheckResult]:
    """--min-capacity: one check per search × tier of a run with a search: block (results/capacity.py)."""
    from servesweep.results.capacity import gate

    try:
        checks = gate(run_dir, min_capacity, baseline)
        return [CheckResult(name, check, "capacity", ok, "", msg) for name, check, ok, msg in checks]
    except ValueError as e:
        raise GateError(f"--min-capacity: {e}") from None


def check_run(
    run_dir: Path,
    slo_texts: list[str],
    *,
    baseline: Path | None = None,
    max_regression: str = "10%",
    reg_metrics: list[str] | tuple[str, ...] = (),
    resamples: int = 1000,
    seed: int = 0,
    min_capacity: str | None = None,
    allow_degraded: bool = False,
    max_failure_rate: str | None = None,
) -> Verdict:
    """What `servesweep gate` checks: the run against `slo_texts` (expressions; none: the experiment's `slo`, else those
    `servesweep load --slo` recorded) and a baseline run, with the limits as the command's options give them. A
    bad option, a run folder that cannot be read or nothing to check is the verdict's error (exit 2)."""
    subject = str(run_dir)
    try:
        try:
            limit = parse_fraction(max_regression, "--max-regression")
            fail_limit = (
                UNSET if max_failure_rate is None else parse_share(max_failure_rate, "--max-failure-rate")
            )
        except BadOption as e:
            raise GateError(str(e)) from None
        run = load_run(run_dir)
        subject = run.run_id
        slos = parse_slos(list(slo_texts) or experiment_slos(run))
        try:
            mets = [metric(n) for n in reg_metrics] or None
        except ValueError as e:
            raise GateError(f"--regression-metric: {e}") from None
        base = load_run(baseline) if baseline is not None else None
        if not any(not s.per_request for s in slos) and base is None and min_capacity is None:
            if slos:
                raise GateError(
                    "nothing to check: per-request SLOs ("
                    + ", ".join(s.text for s in slos)
                    + ") only say which "
                    "requests are good; add goodput_ratio>=90% or an aggregate SLO like ttft_p99<=2s"
                )
            raise GateError("nothing to check: give --slo (the run's experiment has no slo) or --baseline")
        verdict = evaluate_run(
            run,
            slos,
            baseline=None if min_capacity is not None else base,
            max_regression=limit,
            regression_metrics=mets,
            resamples=resamples,
            seed=seed,
            allow_degraded=allow_degraded,
            max_failure_rate=fail_limit,
        )
        if min_capacity is not None:
            verdict.results += capacity_checks(run_dir, min_capacity, baseline)
    except (GateError, RunError, SLOError) as e:
        verdict = Verdict([], subject, error=str(e))
    return verdict
