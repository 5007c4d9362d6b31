"""A point's degeneration figures, from the texts its records keep (results/answer_checks.py judges each text).

Judged: the measured (not warmup), successful requests that kept a text. A request is degenerate when its answer
or its reasoning is (a model that loops while thinking never reaches its answer). Run by the parent after the
point (driver/point_run.py, results/compare.py's samples), never inside Locust: ~3 ms per 1,000 tokens.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from servesweep.results.answer_checks import degenerate

MOSTLY_DEGENERATE = 0.5  # a point past this share of degenerate answers is flagged loudly, whatever its speed
EXAMPLES = 3  # distinct reasons kept in the summary


def _verdict(answer: str | None, reasoning: str | None) -> tuple[bool, list[str]] | None:
    """(degenerate, reasons) of one response; None when it kept no text."""
    if answer is None and reasoning is None:
        return None
    bad, why = False, []
    for what, text in (("answer", answer), ("reasoning", reasoning)):
        if text:
            d, reasons, _ = degenerate(text)
            if d:
                bad = True
                why += [f"{what}: {r}" for r in reasons]
    return bad, why


def _column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist() if name in table.schema.names else [None] * table.num_rows


def degenerate_flags(table: pa.Table, ok: np.ndarray) -> tuple[np.ndarray, list[list[str]]]:
    """Per row of `table`: 1.0 degenerate, 0.0 not, NaN not judged (failed, or no text); and each row's reasons."""
    flags = np.full(table.num_rows, np.nan)
    reasons: list[list[str]] = [[] for _ in range(table.num_rows)]
    answers, thoughts = _column(table, "response_text"), _column(table, "reasoning_text")
    for i in np.flatnonzero(ok):
        v = _verdict(answers[i], thoughts[i])
        if v is not None:
            flags[i] = float(v[0])
            reasons[i] = v[1]
    return flags, reasons


def degeneration_summary(table: pa.Table) -> dict:
    """`degenerate_rate` (None when nothing was judged) and `degeneration`: judged, degenerate, example reasons."""
    if table.num_rows:
        warm = table.column("warmup").to_numpy(zero_copy_only=False).astype(bool)
        table = table.filter(pa.array(~warm))
    ok = np.array([e is None for e in table.column("error_class").to_pylist()], dtype=bool)
    flags, reasons = degenerate_flags(table, ok)
    judged = ~np.isnan(flags)
    n, bad = int(judged.sum()), int(np.nansum(flags))
    examples: dict[str, str] = {}  # one example per kind of reason ("answer: loop", "reasoning: top word")
    for r in reasons:
        if r and len(examples) < EXAMPLES:
            examples.setdefault(":".join(r[0].split(":", 2)[:2]), r[0])
    return {
        "degenerate_rate": bad / n if n else None,
        "degeneration": {"judged": n, "degenerate": bad, "examples": list(examples.values())},
    }


def degeneration_warning(summary: dict) -> str | None:
    """The console's loud line for a point whose answers are mostly degenerate; None otherwise."""
    rate = summary.get("degenerate_rate")
    if rate is None or rate <= MOSTLY_DEGENERATE:
        return None
    d = summary.get("degeneration") or {}
    tok = summary.get("output_tokens_per_s")
    speed = f" at {tok:.0f} output tok/s" if tok else ""
    why = f" ({d['examples'][0]})" if d.get("examples") else ""
    return (
        f"DEGENERATE ANSWERS: {d.get('degenerate', '?')} of {d.get('judged', '?')} responses of point "
        f"{summary.get('point_id', '?')} are degenerate{speed}{why}: its speed figures measure garbage"
    )


def degenerate_cell(summary: dict) -> str:
    """The console table's cell: the degenerate share in %, red past MOSTLY_DEGENERATE, "-" when not judged."""
    rate = summary.get("degenerate_rate")
    if rate is None:
        return "-"
    cell = f"{rate * 100:.0f}"
    return f"[bold red]{cell}[/]" if rate > MOSTLY_DEGENERATE else cell
