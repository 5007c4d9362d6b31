"""One definition per ITL name on every surface (issue 34, item 1; docs/metrics.md "ITL: per chunk and per token").

One set of records whose streams are known: every token-bearing chunk carries 3 tokens and comes 30 ms after the
one before, so ITL per chunk is 30 ms and ITL per token 10 ms. For each surface, through its own code, the value it
shows under each name and the label it shows it with:

- `itl` / "per chunk" is 30 ms and `itl_per_token` / "per token" is 10 ms in summary.json, the CLI table
  (`servesweep load`, the web UI's steps tab and steps.csv), the report (HTML and Markdown), compare, gate
  (SLO checks and regression checks), the exporter (histograms and point gauges), the Grafana dashboards (every
  panel, column and chart that queries an ITL metric) and the Locust web UI (the LLM tab's rows, the live charts'
  series and the step chart's column);
- no label anywhere says "ITL" without saying which.

The web UI's pages run only inside Locust (they import it): here their Python halves (client/live_stats.py, client/charts.py)
and static files (webui_static/charts.js, charts.html) are checked; the browser tests
tests/client/test_webui.py (LLM tab rows against the records) and tests/client/test_webui_charts.py (the charts'
series drawn, by legend name) cover them running.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servesweep.client import charts
from servesweep.client.live_stats import LATENCIES, LiveStats, Sketch
from servesweep.config.slo import ITL_PER_CHUNK, ITL_PER_TOKEN, QUALIFIERS, parse_slos
from servesweep.observe.dashboards import build_all, expressions, metric_names
from servesweep.observe.exporter import HISTOGRAMS, SUMMARY_LATENCIES, ClientMetrics
from servesweep.results.compare import DEFAULT_METRICS, compare_runs, metric, rich_table
from servesweep.results.gates import evaluate_records
from servesweep.results.records import to_table, write_parquet
from servesweep.results.report import COLUMNS, build_report, render_html, render_markdown
from servesweep.results.runfolder import load_run
from servesweep.results.summary import summarize
from servesweep.results.table import results_table

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

MS = 1_000_000
GAP_MS, TOKENS, CHUNKS = 30.0, 3, 5
PER_CHUNK_MS, PER_TOKEN_MS = GAP_MS, GAP_MS / TOKENS  # 30 and 10
STATIC = Path(charts.__file__).with_name("webui_static")

# What each name means: the value the records give it.
WANT = {"itl": PER_CHUNK_MS, "itl_per_token": PER_TOKEN_MS}
WORDS = {"itl": ITL_PER_CHUNK, "itl_per_token": ITL_PER_TOKEN}


def _record(i: int) -> dict:
    sent = 1_000 * MS + i * 500 * MS
    first = sent + 100 * MS
    chunks = [first + int(k * GAP_MS * MS) for k in range(CHUNKS)]
    return {
        "request_id": f"r{i}",
        "point_id": "p1",
        "worker": "w",
        "user": i % 2,
        "warmup": False,
        "scheduled_ns": sent,
        "sent_ns": sent,
        "headers_ns": sent,
        "first_token_ns": first,
        "chunk_ns": chunks,
        "chunk_tokens": [TOKENS] * CHUNKS,
        "end_ns": chunks[-1] + MS,
        "prompt_tokens": 100,
        "completion_tokens": TOKENS * CHUNKS,
        "cached_tokens": 0,
        "reasoning_tokens": None,
        "target_prompt_tokens": 100,
        "target_output_tokens": TOKENS * CHUNKS,
        "finish_reason": "length",
        "http_status": 200,
        "error_class": None,
        "error_message": None,
        "mono_to_wall_ns": 1_700_000_000 * 10**9,
    }


RECORDS = [_record(i) for i in range(8)]


def _labelled(label: str) -> str | None:
    """Which ITL a label names ('itl', 'itl_per_token'), None when it names none; fails on an ITL without a word."""
    low = label.lower()
    if "itl" not in low and "inter-token" not in low and "inter_token" not in low:
        return None
    chunk = "chunk" in low
    token = "per token" in low or "/token" in low or "itl_per_token" in low
    assert chunk != token, f"{label!r} says ITL but not which one (per chunk or per token)"
    return "itl" if chunk else "itl_per_token"


@pytest.fixture(scope="module")
def summary() -> dict:
    return summarize(to_table(RECORDS))


def test_the_records_are_what_the_names_say(summary):
    """summary.json: itl_ms is every chunk gap, itl_per_token_ms every gap over its chunk's tokens, once per token."""
    assert summary["itl_ms"]["p50"] == pytest.approx(PER_CHUNK_MS)
    assert summary["itl_ms"]["n"] == len(RECORDS) * (CHUNKS - 1)
    assert summary["itl_per_token_ms"]["p50"] == pytest.approx(PER_TOKEN_MS)
    assert summary["itl_per_token_ms"]["n"] == len(RECORDS) * (CHUNKS - 1) * TOKENS
    assert QUALIFIERS == {"itl": ITL_PER_CHUNK, "itl_per_token": ITL_PER_TOKEN}


def test_cli_table(summary):
    """`servesweep load`'s table (and the web UI's steps tab and steps.csv, which are its columns)."""
    t = results_table([{**summary, "point": {"concurrency": 2}}])  # run_point adds the point
    seen = {}
    for col in t.columns:
        which = _labelled(col.header)
        if which:
            cell = next(iter(col.cells))
            if "p50" in col.header:
                seen[which] = float(cell)
    assert seen == pytest.approx(WANT)


def test_report_compare_and_gate(tmp_path, summary):
    """Report columns (HTML, Markdown), compare (labels and values) and gate (SLO and regression messages)."""
    for name in ("a", "b"):
        write_parquet(to_table(RECORDS), tmp_path / f"{name}.parquet")
    a, b = load_run(tmp_path / "a.parquet"), load_run(tmp_path / "b.parquet")

    # the report: its columns' headers say which, and each shows the records' value
    rep = build_report(b, baselines=[a])
    html, md = render_html(rep), render_markdown(rep)
    itl_cols = [(key, head, name) for key, head, name, _u, _d in COLUMNS if name and _labelled(head)]
    assert {metric(name).base for _k, _h, name in itl_cols} == {"itl", "itl_per_token"}
    for key, head, name in itl_cols:
        base = metric(name).base
        assert _labelled(head) == base, (head, name)
        assert f"<th>{head}</th>" in html and head in md
        if metric(name).stat == "p50":
            shown = re.search(rf'data-key="{key}" data-value="([^"]+)"', html)
            assert shown and float(shown.group(1)) == pytest.approx(WANT[base]), (key, shown)

    # compare: the default metrics have both, labelled, with the records' values
    assert {"itl_p50", "itl_per_token_p50"} <= set(DEFAULT_METRICS)
    rc = compare_runs(a, b, resamples=20)
    changes = {c.metric.name: c for c in rc.points[0].changes}
    for name in ("itl_p50", "itl_per_token_p50"):
        c = changes[name]
        assert _labelled(c.metric.label) == c.metric.base and WORDS[c.metric.base] in c.metric.label
        assert c.a == pytest.approx(WANT[c.metric.base]) and c.b == pytest.approx(WANT[c.metric.base])
        assert c.as_dict()["label"] == c.metric.label
        assert f">{c.metric.label}<" in html  # the report's comparison table
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(rich_table(rc))
    text = con.export_text()
    assert "itl_p50 (per chunk)" in text and "itl_per_token_p50 (per token)" in text

    # gate: the same names mean the same values; the messages say which
    v = evaluate_records(to_table(RECORDS), "itl_p50<=31ms,itl_p50>=29ms,itl_per_token_p50<=11ms,itl_per_token_p50>=9ms")
    assert v.results and all(r.passed for r in v.results), [r.message for r in v.results]
    for r in v.results:
        base = parse_slos(r.check)[0].metric.base
        assert _labelled(r.message) == base and WORDS[base] in r.message, r.message
    bad = evaluate_records(to_table(RECORDS), "itl_p50<=20ms")
    assert [r.passed for r in bad.results] == [False]


def test_gate_regression_messages(tmp_path):
    """A regression check's message names its metric with the word (`itl_p50 (per chunk) +0.0% vs baseline ...`)."""
    from servesweep.results.gates import evaluate_run

    for name in ("a", "b"):
        write_parquet(to_table(RECORDS), tmp_path / f"{name}.parquet")
    v = evaluate_run(
        load_run(tmp_path / "b.parquet"),
        [],
        baseline=load_run(tmp_path / "a.parquet"),
        regression_metrics=[metric("itl_p50"), metric("itl_per_token_p50")],
        resamples=20,
    )
    msgs = [r.message for r in v.results if r.kind == "regression"]
    assert len(msgs) == 2 and "per chunk" in msgs[0] and "per token" in msgs[1], msgs


def _exposition(m: ClientMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.text().decode())}


def _sample(fams, family: str, sample: str, **labels) -> float:
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no {sample} {labels}")


def test_exporter(summary):
    """Histograms (live) and point gauges (finished points): same names, same definitions, the HELP says which."""
    m = ClientMetrics("run-a")
    m.point_started("p1", {"model": "m", "config": "c", "concurrency": 2})
    m.observe_many(RECORDS)
    m.point_finished("p1", summary)
    f = _exposition(m)
    for base, hist in (("itl", "servesweep_itl_seconds"), ("itl_per_token", "servesweep_itl_per_token_seconds")):
        mean = _sample(f, hist, hist + "_sum") / _sample(f, hist, hist + "_count")
        assert mean * 1e3 == pytest.approx(WANT[base]), hist
        assert WORDS[base] in f[hist].documentation, f[hist].documentation
        assert WORDS[base] in HISTOGRAMS[hist.removeprefix("servesweep_")]
        gauge = f"servesweep_point_{base}_seconds"
        assert _sample(f, gauge, gauge, stat="p50") * 1e3 == pytest.approx(WANT[base]), gauge
        assert WORDS[base] in SUMMARY_LATENCIES[base] and WORDS[base] in f[gauge].documentation


# The exporter's and SGLang's ITL series, by what they hold.
DASH_METRICS = {
    "servesweep_itl_seconds": "itl",
    "servesweep_point_itl_seconds": "itl",
    "servesweep_capacity_itl_p99_seconds": "itl",
    "servesweep_itl_per_token_seconds": "itl_per_token",
    "servesweep_point_itl_per_token_seconds": "itl_per_token",
    "sglang:inter_token_latency_seconds": "itl_per_token",  # per token (reference sglang.md §5)
}


def _itl_of(expr: str) -> set[str]:
    out = set()
    for n in metric_names(expr):
        fam = re.sub(r"_(bucket|sum|count)$", "", n)
        if fam in DASH_METRICS:
            out.add(DASH_METRICS[fam])
        else:
            assert "itl" not in fam and "inter_token" not in fam, f"{fam}: an ITL series this test does not know"
    return out


def _all_panels(panels: list[dict]) -> list[dict]:
    return [x for p in panels for x in (p, *_all_panels(p.get("panels", [])))]


def test_grafana_dashboards():
    """Every panel (time series, chart) or table column that queries an ITL series is titled with its word, and
    every title that says ITL says which."""
    checked = {"itl": 0, "itl_per_token": 0}
    for dash_name, dash in build_all().items():
        for p in _all_panels(dash["panels"]):
            _labelled(p["title"])  # any title saying ITL says which
            if p["type"] == "table":
                rename = next(
                    (t["options"]["renameByName"] for t in p.get("transformations", []) if t["id"] == "organize"), {}
                )
                for col in rename.values():
                    _labelled(col)
                for t in p["targets"]:
                    for which in _itl_of(t["expr"]):
                        col = rename.get(f"Value #{t['refId']}") or rename.get("Value", "")
                        assert _labelled(col) == which, (dash_name, p["title"], col, t["expr"])
                        checked[which] += 1
            else:
                for t in p.get("targets", []):
                    for which in _itl_of(t["expr"]):
                        assert _labelled(p["title"]) == which, (dash_name, p["title"], t["expr"])
                        checked[which] += 1
    assert checked["itl"] and checked["itl_per_token"], checked
    live = {e["title"] for e in expressions(build_all()["live.json"])}
    assert {"Client ITL per chunk", "Client ITL per token", "Server ITL per token"} <= live


def test_web_ui_llm_tab_and_charts():
    """The LLM tab (client/live_stats.py LATENCIES, what webui.llm_rows lists) and the charts' series (client/charts.py,
    webui_static/charts.js and charts.html)."""
    live = LiveStats()
    for r in RECORDS:
        live.add_record(r)
    snap = live.snapshot()
    for key, base in (("itl_ms", "itl"), ("itl_per_token_ms", "itl_per_token")):
        assert _labelled(LATENCIES[key]) == base, LATENCIES[key]
        assert snap["latency"][key]["p50"] == pytest.approx(WANT[base], rel=Sketch.ALPHA)
    for title in LATENCIES.values():
        _labelled(title)

    # the live charts' samples (from the record buffer's columns, as Series.tick reads them)
    cols = {k: [r[k] for r in RECORDS] for k in RECORDS[0]}
    _ttft, per_chunk, per_token = charts._latencies(cols)
    assert np.median(per_chunk) == pytest.approx(PER_CHUNK_MS) and np.median(per_token) == pytest.approx(PER_TOKEN_MS)

    class Buffer:
        def columns_since(self, n):
            return cols, len(RECORDS)

    class Env:
        servesweep = type("Ctx", (), {"buffer": Buffer(), "issued": 0, "completed": 0})()
        runner = None

    sample = charts.Series().tick(Env(), None, now=0.0)
    assert sample["itl_p99_ms"] == pytest.approx(PER_CHUNK_MS)
    assert sample["itl_per_token_p99_ms"] == pytest.approx(PER_TOKEN_MS)

    # charts.js: each ITL series is named by its word: the live series by series.json's key, the step chart's by
    # the load table's column it reads (a column that table has)
    js = (STATIC / "charts.js").read_text()
    series = re.findall(r'line\("([^"]*)", "([^"]*)"\)', js)
    sample_keys = {"itl_p99_ms": "itl", "itl_per_token_p99_ms": "itl_per_token"}
    headers = [c.header for c in results_table([]).columns]
    seen = set()
    for name, key in series:
        which = sample_keys.get(key) or _labelled(key)
        if which is None:
            assert "itl" not in key.lower(), (name, key)
            continue
        assert key in sample or key in headers, (name, key)
        assert _labelled("ITL " + name) == which, (name, key)
        seen.add(key)
    assert set(sample_keys) <= seen and any(k in headers for k in seen), seen
    html = (STATIC / "charts.html").read_text()
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", html)
    itl_caps = [c for c in captions if "ITL" in c]
    assert len(itl_caps) == 2
    assert "per chunk" in itl_caps[0] and "per token" in itl_caps[0]  # both series in one chart
    assert _labelled(itl_caps[1]) == "itl"
    assert not math.isnan(sample["ttft_p50_ms"])


def test_no_bare_itl_label_in_the_package():
    """Every other surface (the `servesweep run` console and results table, the capacity table, ...): no string in
    the package labels an ITL percentile ("ITL p50", "ITL p99 ms") without saying which."""
    import ast

    import servesweep

    bare = re.compile(r"\bITL p\d\d\b(?!.{0,25}(?:chunk|token))")  # "ITL p99: per chunk and per token" says
    found = []
    for f in Path(servesweep.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and bare.search(node.value):
                found.append(f"{f.name}:{node.lineno}: {node.value[:80]!r}")
    for f in STATIC.iterdir():
        found += [f"{f.name}: {m}" for m in bare.findall(f.read_text())]
    assert not found, found
