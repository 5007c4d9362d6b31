"""The report's "Answers" section: needle accuracy per server configuration and prompt length (the run's needle
probes, answers/<config>.json read through results/needle_file.py, checked; scored by results/needle.py) and the
speculative bundles' answers against the autoregressive bundle's."""

from __future__ import annotations

import math
from html import escape

from servesweep.results.needle import mismatch_rows, needle_rows
from servesweep.results.needle_file import read_all_probes


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:.0f}%"


def answers_tables(run) -> tuple[list[list[str]], list[list[str]]]:
    """(needle rows, mismatch rows) as text cells; both empty when the run has no probes."""
    if getattr(run, "kind", None) == "records":
        return [], []
    probes = read_all_probes(run.path)
    configs = run.manifest.get("configs") or {}
    needle = [
        [r["config_id"], str(r["prompt_tokens"]), f"{r['correct']}/{r['n']}", _pct(r["needle_accuracy"]),
         str(r.get("failed", 0))]
        for r in needle_rows(probes)
    ]  # fmt: skip
    mismatch = [
        [
            r["config_id"],
            r["autoregressive"],
            str(r["n"]),
            _pct(r["mismatch_rate"]),
            _pct(r["prefix_agreement"]),
        ]
        for r in mismatch_rows(probes, configs)
    ]
    return needle, mismatch


NEEDLE_HEADER = ["configuration", "prompt tokens", "right", "needle accuracy", "failed probes"]
MISMATCH_HEADER = ["speculative", "autoregressive", "prompts", "answers differ", "common prefix"]
_NOTE = (
    "Needle probes: greedy requests per prompt length, EOS allowed, sent once the configuration's server was "
    "ready and counted in no point; an answer is right when it states the code hidden in its prompt "
    "(docs/answers.md)."
)


def answers_markdown(tables: tuple[list, list]) -> list[str]:
    needle, mismatch = tables
    if not needle:
        return []
    out = ["## Answers", "", _NOTE, "", _md(NEEDLE_HEADER, needle), ""]
    if mismatch:
        out += [
            "Speculative decoding against autoregressive, same prompts:",
            "",
            _md(MISMATCH_HEADER, mismatch),
            "",
        ]
    return out


def answers_html(tables: tuple[list, list]) -> str:
    needle, mismatch = tables
    if not needle:
        return ""
    parts = [
        '<section id="answers"><h2>Answers</h2>',
        f"<p>{escape(_NOTE)}</p>",
        _html(NEEDLE_HEADER, needle, "needle"),
    ]
    if mismatch:
        parts += ["<h3>Speculative against autoregressive</h3>", _html(MISMATCH_HEADER, mismatch, "mismatch")]
    return "\n".join(parts + ["</section>"])


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _html(header: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
