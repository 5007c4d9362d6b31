"""The report's plots: matplotlib (Agg backend, object API, no pyplot state) rendered to inline SVG strings.

Each function takes plain series and returns an `<svg>` element. Text stays text (svg.fonttype none) so the page
stays small and searchable; each figure gets its own hash salt so the ids inside different SVGs never collide
when they sit in one HTML page.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # headless, before anything imports a backend

from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

_counter = itertools.count()
_MARKERS = "osD^v<>ph*"


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(6.4, 3.9), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"servesweep-{next(_counter)}"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    # Inline in HTML: drop the XML prolog and DOCTYPE, keep the <svg> element.
    return text[text.index("<svg") :]


def _finish(ax, n_series: int) -> None:
    if n_series > 1:
        ax.legend(fontsize=8, ncols=1 if n_series <= 8 else 2)


def throughput_vs_concurrency(series: Mapping[str, Sequence[tuple[float, float]]], title: str) -> str:
    """Aggregate output tok/s against concurrency, one line per configuration / prompt length."""
    fig, ax = _figure(title, "concurrency (users)", "output tokens/s (aggregate)")
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted(p for p in pts if _finite(p[1]))
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=_MARKERS[i % len(_MARKERS)], label=label)
    _concurrency_x(ax, [p[0] for pts in series.values() for p in pts])
    _finish(ax, len(series))
    return _svg(fig)



def tokens_per_joule_vs_concurrency(
    series: Mapping[str, Sequence[tuple[float, float]]], title: str, throttled: Sequence[tuple[float, float]] = ()
) -> str:
    """Output tokens per joule of GPU energy (summary.json's gpu, idle included) against concurrency, one line per
    configuration / prompt length; points whose GPUs throttled ringed red (higher is better)."""
    fig, ax = _figure(title, "concurrency (users)", "output tokens per joule")
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted(p for p in pts if _finite(p[1]))
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=_MARKERS[i % len(_MARKERS)], label=label)
    if throttled:
        ax.plot(*zip(*throttled, strict=True), ls="none", marker="o", ms=11, mfc="none", mec="red",
                label="GPU throttled")  # fmt: skip
    _concurrency_x(ax, [p[0] for pts in series.values() for p in pts])
    _finish(ax, len(series) + bool(throttled))
    return _svg(fig)

def ttft_vs_prompt(
    series: Mapping[str, Sequence[tuple[float, float, float, int]]], title: str, small_sample: int = 0
) -> str:
    """TTFT p50 (solid) and p99 (dashed) against prompt length, one colour per concurrency; points are
    (prompt tokens, p50, p99, requests). A p99 from fewer than `small_sample` requests gets an open circle, and a
    note under the plot gives the counts (one label per point would pile up where every point is small)."""
    fig, ax = _figure(title, "prompt tokens", "TTFT (ms)")
    small: list[int] = []
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted(p for p in pts if _finite(p[1]))
        if not pts:
            continue
        xs = [p[0] for p in pts]
        (line,) = ax.plot(xs, [p[1] for p in pts], marker=_MARKERS[i % len(_MARKERS)], label=f"{label} p50")
        ax.plot(xs, [p[2] for p in pts], ls="--", color=line.get_color(), alpha=0.7, label=f"{label} p99")
        few = [(x, p99, n) for x, _, p99, n in pts if n < small_sample and _finite(p99)]
        if few:
            ax.plot([f[0] for f in few], [f[1] for f in few], ls="none", marker="o", ms=8, mfc="none",
                    mec=line.get_color())  # fmt: skip
            small += [f[2] for f in few]
    xs = [p[0] for pts in series.values() for p in pts]
    if xs and max(xs) / max(min(xs), 1) >= 8:
        ax.set_xscale("log")
        _plain_log_labels(ax.xaxis, [x for x in xs if x > 0])
    if small:
        n = f"{min(small)}" if min(small) == max(small) else f"{min(small)}–{max(small)}"
        _small_note(
            fig, f"○ p99 from fewer than {small_sample} requests (n={n}), so its tail is not measured"
        )
    _finish(ax, 2 * len(series))
    return _svg(fig)


def latency_throughput(series: Mapping[str, Sequence[tuple[float, float, int]]], title: str) -> str:
    """The trade-off curve: per-request decode tok/s against aggregate tok/s, each point labelled with its
    concurrency (up and to the right is better)."""
    fig, ax = _figure(title, "output tokens/s (aggregate)", "tokens/s per request (decode)")
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted((p for p in pts if _finite(p[0]) and _finite(p[1])), key=lambda p: p[2])
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=_MARKERS[i % len(_MARKERS)], label=label)
        for x, y, c in pts:
            ax.annotate(f"c{c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    _finish(ax, len(series))
    return _svg(fig)


def itl_distribution(dists: Mapping[str, Sequence[float]], title: str, small_sample: int = 0) -> str:
    """Empirical CDF of inter-token gaps, one line per concurrency (a step at each gap; tails show stalls); a line
    of fewer than `small_sample` gaps says so in its legend entry."""
    import numpy as np

    fig, ax = _figure(title, "ITL per chunk: gap between chunks (ms)", "fraction of gaps ≤ x")
    drawn = 0
    small = False
    for i, (label, vals) in enumerate(dists.items()):
        v = np.sort(np.asarray(vals, dtype=float))
        v = v[np.isfinite(v)]
        if v.size == 0:
            continue
        if v.size > 4000:  # the curve's shape needs no more points than pixels
            v = v[np.linspace(0, v.size - 1, 4000).astype(int)]
        y = np.linspace(1.0 / v.size, 1.0, v.size)
        few = f" < {small_sample}" if len(vals) < small_sample else ""
        ax.step(v, y, where="post", label=f"{label} (n={len(vals)}{few})", color=f"C{i % 10}")
        small = small or bool(few)
        drawn += 1
    pos = [x for vals in dists.values() for x in vals if x > 0]
    if pos and max(pos) / min(pos) > 20:
        ax.set_xscale("log")
        _plain_log_labels(ax.xaxis, pos)
    ax.set_ylim(0, 1.02)
    if small:
        _small_note(
            fig,
            f"n < {small_sample}: a distribution from fewer than {small_sample} gaps, its tail not measured",
        )
    _finish(ax, drawn)
    return _svg(fig)


def estimate_vs_actual(rows: Sequence[tuple[str, float, float]], title: str) -> str:
    """The planner's estimate against the measured wall time per point (seconds): horizontal bars, so every
    point's full name is a readable label (the figure grows with the points, top to bottom in run order)."""
    import numpy as np

    longest = max((len(r[0]) for r in rows), default=10)
    fig = Figure(figsize=(6.4 + 0.055 * max(longest - 30, 0), 1.6 + 0.28 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("seconds")
    ax.grid(True, axis="x", alpha=0.3)
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r[1] for r in rows], height=0.4, label="planner estimate")
    ax.barh(y + 0.2, [r[2] for r in rows], height=0.4, label="actual")
    ax.set_yticks(y, [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()  # the first point on top
    # outside the axes: no bar hides under it
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    return _svg(fig)


def _finite(x) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


def _concurrency_x(ax, xs: Sequence[float]) -> None:
    """Concurrency is a whole number of users: ticks at the measured values on a log2 axis when they span 8x or
    more, else whole numbers only (never 1.5 or 2.5); no minor tick labels."""
    xs = [x for x in xs if x and x > 0]
    if xs and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(xs))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _plain_log_labels(axis, values: Sequence[float]) -> None:
    """A log axis labelled as plain numbers (0.5, 1, 2, 5, 10) at 1-2-5 steps when it spans up to 3 decades, at
    decades beyond; minor ticks unlabelled. matplotlib's own formatter labels minor ticks (2×10¹, 3×10¹ ...) when
    an axis spans about a decade, and those labels overlap."""
    decades = math.log10(max(values) / min(values))
    subs = (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _small_note(fig: Figure, text: str) -> None:
    """A line under the plot (the layout makes room for it): which values rest on too few samples."""
    fig.supxlabel(text, fontsize=7, color="#8a5a00", x=0.01, ha="left")


def energy_frontier(
    series: Mapping[str, Sequence[tuple[float, float, str]]],
    front: Sequence[tuple[float, float]],
    throttled: Sequence[tuple[float, float]],
    title: str,
) -> str:
    """Output tokens per joule against output tok/s per GPU, one line per configuration (points labelled with their
    load), the energy Pareto frontier in black, throttled probes ringed red (up and to the right is better)."""
    fig, ax = _figure(title, "output tok/s per GPU", "output tokens per joule")
    for i, (label, pts) in enumerate(sorted(series.items())):
        pts = sorted((p for p in pts if _finite(p[0]) and _finite(p[1])), key=lambda p: p[0])
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=_MARKERS[i % len(_MARKERS)], ls=":", label=label)
        for x, y, load in pts:
            ax.annotate(load, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if front:
        # ringed too: a frontier of one probe is no line
        ax.plot(*zip(*front, strict=True), color="black", linewidth=2, alpha=0.6, marker="s", ms=10, mfc="none",
                label="energy Pareto frontier")  # fmt: skip
    if throttled:
        ax.plot(*zip(*throttled, strict=True), ls="none", marker="o", ms=11, mfc="none", mec="red",
                label="GPU throttled")  # fmt: skip
    ax.margins(0.1)  # the load labels above the highest point stay inside
    _finish(ax, len(series) + bool(front) + bool(throttled))
    return _svg(fig)
