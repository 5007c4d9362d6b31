"""Needle probes in `servesweep run` (matrix/answer_probes.py): shrunk dry runs of the quickstart matrix (an
autoregressive and an MTP bundle of one model) on emulators whose answers are broken on purpose
(`launcher.sim_args.sim_answer_fault`), each caught by its check in the run folder and the report."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from support import run_servesweep

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def dry_run(tmp: Path, fault: str | None, prompt_tokens: list[int]) -> tuple[dict, Path, str]:
    d = yaml.safe_load(QUICKSTART.read_text())
    if fault:
        d["launcher"]["sim_args"]["sim_answer_fault"] = fault
    d["server"]["base"]["context_length"] = 16384
    d["load"].update(concurrency=[1], prompt_tokens=prompt_tokens, output_tokens=24)
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    rc, text = run_servesweep("run", str(f), "--dry-run", "--out", str(tmp / "runs"), timeout=300, columns=200)
    assert rc == 0, text[-5000:]
    run_dir = next((tmp / "runs").iterdir())
    return json.loads((run_dir / "manifest.json").read_text()), run_dir, text


def bundles(m: dict) -> tuple[str, str]:
    """(autoregressive config id, speculative config id)."""
    spec = [c for c, v in m["configs"].items() if v["flags"].get("speculative_algorithm")]
    ar = [c for c in m["configs"] if c not in spec]
    return ar[0], spec[0]


PROGRESS_S = 0.1  # the probes' progress interval in the run below (SERVESWEEP_PROBE_PROGRESS_S; 5 s by default)
PROGRESS = re.compile(
    r"(\S+): (\d+) of (\d+) needle probe\(s\) answered(?:, (\d+) outstanding at ([\d, ]+) prompt tokens)? \(([\d.]+) s\)"
)


def probe_progress(text: str) -> dict[str, list[tuple[int, int, int, float]]]:
    """{config id: [(answered, of, outstanding, seconds), ...]} of the probes' progress lines, in order."""
    out: dict[str, list[tuple[int, int, int, float]]] = {}
    for cid, k, n, pending, _at, s in PROGRESS.findall(text):
        out.setdefault(cid, []).append((int(k), int(n), int(pending or 0), float(s)))
    return out


def test_wrong_past_is_caught_by_the_needle_at_the_long_prompt_only(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_PROBE_PROGRESS_S", str(PROGRESS_S))
    m, run_dir, out = dry_run(tmp_path, "wrong_past:3000", [1000, 6000])
    ar, spec = bundles(m)
    for cid in (ar, spec):
        assert m["configs"][cid]["needle_accuracy"] == {"1000": 1.0, "6000": 0.0}, m["configs"][cid]
    text = " ".join(out.split())
    assert f"needle {ar} @ 6000 tokens: 0% (0/3)" in text
    # and loudly, after the lines (issue 34: as loud as mostly degenerate answers), for both bundles, at 6000 only
    for cid in (ar, spec):
        assert f"LOW NEEDLE ACCURACY: configuration {cid} found the needle in 0 of 3 prompts at 6,000 tokens" in text
        assert f"configuration {cid} found the needle in 3 of 3" not in text
    # what it does while the probes are out, and how far it is (issue 34, item 8)
    sent = f"{ar}: 6 needle probe(s) at 1,000, 6,000 prompt tokens sent"
    answered = f"{ar}: 6 of 6 needle probe(s) answered ("
    assert sent in text and answered in text and text.index(sent) < text.index(answered), out[-3000:]
    # ... while they are out, not only when one comes back: probes held past the interval (a 6000-token prefill on
    # the emulated GPU) get a line each interval, with what is answered, what is outstanding and the time
    for cid in (ar, spec):
        lines = probe_progress(text)[cid]
        *during, last = lines
        assert last[:3] == (6, 6, 0) and last[3] > PROGRESS_S, lines
        assert during and all(pending > 0 and k + pending == n == 6 for k, n, pending, _ in during), lines
        times = [t for *_, t in lines]
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        assert times == sorted(times) and max(gaps) < PROGRESS_S + 1.5, gaps  # bounded (a loaded 2-core box)
    for p in m["points"].values():  # fluent and wrong: not degenerate, and every load figure still reported
        s = json.loads((run_dir / p["dir"] / "summary.json").read_text())  # a point's figures: its summary's
        assert s["degenerate_rate"] == 0.0 and s["output_tokens_per_s"] > 0
        assert s["needle_accuracy"] == (1.0 if p["prompt_tokens"] == 1000 else 0.0)
    report = (run_dir / "report.md").read_text()
    assert f"| {ar} | 6000 | 0/3 | 0% | 0 |" in report and f"| {ar} | 1000 | 3/3 | 100% | 0 |" in report
    # the report says it at its head too (Markdown before the run's facts, HTML in a warning banner)
    head = report.split("- **", 1)[0]
    assert f"LOW NEEDLE ACCURACY: configuration {ar} found the needle in 0 of 3 prompts at 6,000 tokens" in head
    html = (run_dir / "report.html").read_text()
    assert 'id="needle-banner"' in html and f"configuration {spec} found the needle in 0 of 3" in html
    # both bundles are wrong the same way: speculation changed no answer
    assert f"| {spec} | {ar} | 6 | 0% | 100% |" in report, report


def test_spec_diverge_gives_a_mismatch_between_the_speculative_and_autoregressive_bundles(tmp_path):
    m, run_dir, _ = dry_run(tmp_path, "spec_diverge", [1000, 6000])
    ar, spec = bundles(m)
    probes = {c: json.loads((run_dir / "answers" / f"{c}.json").read_text()) for c in (ar, spec)}
    assert probes[spec]["speculative"] and not probes[ar]["speculative"]
    # the code comes first, so the needle is still right; the prose after it differs
    assert m["configs"][spec]["needle_accuracy"] == {"1000": 1.0, "6000": 1.0}
    report = (run_dir / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith(f"| {spec} | {ar} |"))
    assert row.split("|")[4].strip() == "100%", row  # every answer differs
    answers = {c: [p["answer"] for p in probes[c]["probes"]] for c in (ar, spec)}
    assert all(
        a != s and a.split()[:8] == s.split()[:8] for a, s in zip(answers[ar], answers[spec], strict=True)
    )


def _counts(line: str) -> tuple[int, int, int, float]:
    """(answered, of, outstanding, seconds) of one progress line without its config id."""
    ((row,),) = probe_progress("cfg: " + line).values()
    return row


@pytest.mark.fast
def test_outstanding_probes_are_said_every_interval_until_the_last_is_in():
    """A probe held longer than the interval (a 100k-token prefill takes minutes) is said every interval, with how
    many are answered, how many are outstanding at which lengths, and the time; then one line when all are in."""
    from concurrent.futures import ThreadPoolExecutor

    from servesweep.matrix.answer_probes import wait_with_progress

    lines: list[str] = []
    t0 = time.monotonic()
    with ThreadPoolExecutor(3) as ex:
        futures = {ex.submit(time.sleep, 0.05): 1000, ex.submit(time.sleep, 0.05): 1000}
        futures[ex.submit(time.sleep, 0.7)] = 100_000
        t1 = time.monotonic()
        took = wait_with_progress(futures, lines.append, 0.1)
    # the wait is timed from its call, the slow probe's 0.7 s from its submission just before (a loaded machine
    # put 2 ms between them: took 0.698 s, seen in a cold run)
    assert 0.7 - (t1 - t0) <= took <= time.monotonic() - t1
    *during, last = lines
    assert last == f"3 of 3 needle probe(s) answered ({took:.1f} s)", lines
    assert len(during) >= 4, lines  # ~6 intervals of 0.1 s while the slow one is out
    assert all(k + pending == 3 and pending for k, _, pending, _ in map(_counts, during)), lines
    assert during[-1].startswith("2 of 3 needle probe(s) answered, 1 outstanding at 100,000 prompt tokens ("), lines
    times = [_counts(line)[3] for line in lines]
    assert times == sorted(times)


@pytest.mark.fast
def test_a_slow_prompt_build_is_said_once_while_it_runs():
    from servesweep.matrix.answer_probes import said_if_slow

    lines: list[str] = []
    with said_if_slow(lines.append, "building", after_s=0.1):
        time.sleep(0.35)
    with said_if_slow(lines.append, "quick", after_s=0.1):
        pass
    time.sleep(0.2)  # a quick build's line never comes, even later
    assert lines == ["building (over 0.1 s so far)"]


@pytest.mark.fast
def test_probe_lines_name_degenerate_answers_and_prompts_too_short_for_a_needle():
    """What the real-SGLang tier's random model showed: greedy answers that are floods scored only as wrong, and
    300-token prompts (no room for a needle) printed as a bare `- (0/0)`."""
    from servesweep.matrix.answer_probes import _by_length, length_line

    flood = "the the the " * 40
    probes = [
        {"prompt_tokens": 800, "expected": "4812", "answer": "The code is 4812.", "correct": True},
        {"prompt_tokens": 800, "expected": "4812", "answer": flood, "correct": False},
        {"prompt_tokens": 300, "expected": None, "answer": flood, "correct": None},
    ]
    d = _by_length(probes)
    assert d["800"] | {} == {"n": 2, "correct": 1, "failed": 0, "no_needle": 0, "degenerate": 1,
                             "needle_accuracy": 0.5}  # fmt: skip
    assert d["300"]["n"] == 0 and d["300"]["no_needle"] == 1 and d["300"]["degenerate"] == 1
    assert "50% (1/2, 1 degenerate answers)" in length_line("s01", "800", d["800"])
    line = length_line("s01", "300", d["300"])
    assert "- (0/0" in line and "300-token prompts are too short to hide one" in line, line
