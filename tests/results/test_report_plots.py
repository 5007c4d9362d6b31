"""The report's plots and notes as a reader sees them, from a real small `servesweep run` on the emulator
(concurrency 1, 2, 3 × prompt 256 and 1024, 4 requests a point):

- concurrency ticks are whole numbers (a linear 1..3 axis would get 1.5 and 2.5);
- the estimate-vs-actual bars carry every point's full id (no "…");
- no two tick labels of any plot overlap (the ITL CDF's log axis also on synthetic gaps spanning 1.5 decades);
- a p99 of 4 requests says so: n=4 in the HTML and Markdown tables, a note under the table, n=4 in the TTFT plot;
- the Markdown's link to the HTML resolves, for a run folder and for a bare records file (r.report.html);
- the manifest's events are plain text (no Rich markup).
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_compare import run_experiment

from servesweep.results import plots
from servesweep.results.report import SMALL_SAMPLE, build_report, write_report
from servesweep.results.runfolder import load_run

SVG = "{http://www.w3.org/2000/svg}"
MARKUP = re.compile(r"\[/\]|\[/?(?:bold|dim|italic|red|green|yellow|blue|cyan|magenta)\b[^\]]*\]")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return run_experiment(
        tmp_path_factory.mktemp("polish"), "polish", [],
        concurrency=[1, 2, 3], prompt_tokens=[256, 1024], output_tokens=8, requests=4,
    )  # fmt: skip


@pytest.fixture(scope="module")
def figures(run_dir):
    """Every matplotlib figure the report draws, kept as a figure (plots._svg wrapped)."""
    kept = []
    real = plots._svg

    def keep(fig):
        kept.append(fig)
        return real(fig)

    plots._svg = keep
    try:
        rep = build_report(load_run(run_dir))
    finally:
        plots._svg = real
    return rep, kept


def _plot_svg(html: str, kind: str) -> ET.Element:
    m = re.search(rf'data-plot="{kind}">(<svg\b.*?</svg>)', html, re.S)
    assert m, f"no {kind} plot"
    return ET.fromstring(m.group(1))


def _tick_texts(svg: ET.Element, axis: str) -> list[str]:
    """The labels of an axis ('xtick' / 'ytick'), read from the SVG's text (svg.fonttype none keeps it text)."""
    out = []
    for g in svg.iter(f"{SVG}g"):
        if re.fullmatch(rf"{axis}_\d+", g.get("id", "")):
            out += ["".join(t.itertext()).strip() for t in g.iter(f"{SVG}text")]
    return [t for t in out if t]


def _overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of visible tick labels (major and minor, each axis) whose boxes intersect."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    r = FigureCanvasAgg(fig).get_renderer()
    fig.draw(r)
    bad = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            labels = [t.label1 for t in ticks if t.label1.get_visible() and t.label1.get_text()]
            lo, hi = axis.get_view_interval()
            labels = [lb for lb in labels if min(lo, hi) <= _pos(lb, axis) <= max(lo, hi)]
            boxes = [(lb.get_text(), lb.get_window_extent(r)) for lb in labels]
            bad += [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]
    return bad


def _pos(label, axis) -> float:
    x, y = label.get_position()
    return x if axis.axis_name == "x" else y


def test_concurrency_ticks_are_integers(run_dir):
    html, _ = write_report(run_dir)
    labels = _tick_texts(_plot_svg(html.read_text(), "throughput"), "xtick")
    assert labels and all(re.fullmatch(r"\d+", t) for t in labels), labels
    assert {"1", "2", "3"} <= set(labels)


def test_estimate_bars_name_every_point_in_full(run_dir):
    html, _ = write_report(run_dir)
    labels = _tick_texts(_plot_svg(html.read_text(), "estimate"), "ytick")
    done = [p.point_id for p in load_run(run_dir).points if p.status == "done"]
    assert len(done) == 6 and sorted(labels) == sorted(done), labels
    assert not any("…" in t for t in labels)


def test_no_tick_labels_overlap(figures):
    _, figs = figures
    assert len(figs) >= 5  # throughput, TTFT, trade-off, ITL, estimate
    for fig in figs:
        assert _overlaps(fig) == [], fig.axes[0].get_title()


@pytest.mark.fast
def test_itl_log_axis_labels_do_not_overlap():
    """Gaps from 5 to 150 ms (a log axis over 1.5 decades, where matplotlib labels minor ticks)."""
    import numpy as np

    rng = np.random.default_rng(1)
    gaps = {"c1": list(rng.uniform(5, 20, 400)) + [150.0], "c8": list(rng.uniform(10, 40, 400))}
    kept = []
    real = plots._svg
    plots._svg = lambda fig: kept.append(fig) or real(fig)
    try:
        plots.itl_distribution(gaps, "ITL", SMALL_SAMPLE)
    finally:
        plots._svg = real
    (fig,) = kept
    assert fig.axes[0].get_xscale() == "log"
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(labels) >= 3, labels  # readable: more than one decade label
    assert _overlaps(fig) == []


def test_small_samples_are_marked(run_dir):
    html_path, md_path = write_report(run_dir)
    html, md = html_path.read_text(), md_path.read_text()
    # 4 requests a point: every TTFT percentile rests on 4 values
    cells = re.findall(r'data-key="ttft_p99" data-value="[^"]*" data-samples="(\d+)"', html)
    assert cells == ["4"] * 6, cells
    assert 'class="warn small-sample-note"' in html and f"fewer than {SMALL_SAMPLE} values" in html
    assert re.search(r"\| [\d,.]+ \(n=4\) \|", md) and f"fewer than {SMALL_SAMPLE} values" in md
    ttft = ET.tostring(_plot_svg(html, "ttft"), encoding="unicode")
    assert f"p99 from fewer than {SMALL_SAMPLE} requests (n=4)" in ttft
    # ITL gaps: 7 a request x 4 requests = 28 >= 20, so the ITL columns carry no mark
    assert 'data-key="itl_p99" data-value="' in html
    assert not re.search(r'data-key="itl_p99" data-value="[^"]*" data-samples', html)


def _md_link(md: Path) -> Path:
    m = re.search(r"Full report with plots: \[([^\]]+)\]\(([^)]+)\)", md.read_text())
    assert m and m.group(1) == m.group(2), md.read_text()[-300:]
    return (md.parent / m.group(2)).resolve()


def test_markdown_links_the_html_written(run_dir, tmp_path):
    html, md = write_report(run_dir)
    assert _md_link(md) == html.resolve() and html.is_file()
    # a bare records file: r.parquet -> r.report.html and r.report.md beside it
    point = next(p for p in load_run(run_dir).points if p.status == "done")
    rec = tmp_path / "r.parquet"
    shutil.copy(point.records_path, rec)
    html, md = write_report(rec)
    assert html.name == "r.report.html" and md.name == "r.report.md"
    assert _md_link(md) == html.resolve() and html.is_file()
    # --md elsewhere: the link climbs to the HTML
    html, md = write_report(run_dir, md_path=tmp_path / "sub" / "summary.md")
    assert _md_link(md) == html.resolve()


def test_manifest_events_are_plain(run_dir):
    import json

    events = json.loads((run_dir / "manifest.json").read_text())["events"]
    assert events
    for e in events:
        assert not MARKUP.search(e["event"]), e


def test_event_keeps_markup_on_the_console_only():
    """A failure's event (`[red]✗ …[/]`): colour on the console, plain text in the manifest (and so the report)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from servesweep.matrix.orchestrator import Runner
    from servesweep.results.manifest import Manifest

    out = io.StringIO()
    fake = SimpleNamespace(
        m=Manifest(Path("."), {"events": []}), console=Console(file=out, force_terminal=True)
    )
    Runner.event(fake, "[red]✗ s01[/]: server exited [bold]early[/]")
    assert fake.m.data["events"][0]["event"] == "✗ s01: server exited early"
    assert "\x1b[" in out.getvalue()  # the console still gets colour
