"""Needle probes in the run folder: `answers/<config_id>.json` per server configuration (written by
matrix/answer_probes.py), the needle accuracy per configuration and prompt length, and the speculative bundles'
answers against the autoregressive bundle of the same model (docs/answers.md).

A probe file holds `lengths` ({prompt tokens: {n, correct, needle_accuracy}}) and `probes` (one per prompt:
`id` (same prompt, same id in every configuration), `prompt_tokens`, `expected`, `answer`, `correct`, `error`).
"""

from __future__ import annotations

from pathlib import Path

from servesweep.results.answer_checks import answer_mismatch_rate
from servesweep.results.needle_file import NeedleProbesFile, probes_path, read_all_probes

# Below this share of needles found at a prompt length, a configuration's figures at that length are flagged as
# loudly as mostly degenerate answers (results/degeneration.py): a server that does not read its context (a wrong
# RoPE scaling, a broken sliding window, an over-eager prefix cache) streams fluent text at full speed.
LOW_NEEDLE_ACCURACY = 0.5


def read_probes(run_dir: Path) -> dict[str, dict]:
    """Every configuration's probe file, checked (results/needle_file.py), by configuration id (none: {})."""
    return read_all_probes(run_dir)


def is_speculative(flags: dict) -> bool:
    algo = (flags or {}).get("speculative_algorithm")
    return bool(algo) and str(algo).upper() != "NONE"


def needle_rows(probes: dict[str, dict]) -> list[dict]:
    """One row per configuration and prompt length: n, correct, needle_accuracy (None when every probe failed)."""
    rows = []
    for cid, d in probes.items():
        for length, v in sorted((d.get("lengths") or {}).items(), key=lambda kv: int(kv[0])):
            rows.append({"config_id": cid, "prompt_tokens": int(length), **v})
    return rows


def needle_warning(config_id: str, prompt_tokens: int | str, v: dict) -> str | None:
    """The loud line for a configuration that missed most needles at one prompt length; None otherwise (no
    scored probe, or accuracy at or above LOW_NEEDLE_ACCURACY)."""
    acc, n = v.get("needle_accuracy"), v.get("n") or 0
    if acc is None or not n or acc >= LOW_NEEDLE_ACCURACY:
        return None
    return (
        f"LOW NEEDLE ACCURACY: configuration {config_id} found the needle in {v.get('correct', 0)} of {n} prompts "
        f"at {int(prompt_tokens):,} tokens ({acc:.0%}): its figures at that length come from a server that does "
        "not answer from its context"
    )


def needle_warnings(probes: dict[str, dict]) -> list[str]:
    """Every configuration and prompt length of a run's probes that needle_warning flags, in needle_rows order."""
    return [w for r in needle_rows(probes) if (w := needle_warning(r["config_id"], r["prompt_tokens"], r))]


def mismatch_rows(probes: dict[str, dict], configs: dict[str, dict]) -> list[dict]:
    """Each speculative configuration against the first autoregressive one of the same model that was probed:
    answer_mismatch_rate of their answers, prompt by prompt (probes that failed in either are left out)."""

    def model(cid: str) -> str:
        return str(
            (configs.get(cid) or {}).get("flags", {}).get("model_path") or probes[cid].get("model") or ""
        )

    def answers(cid: str) -> dict[str, str]:
        return {p["id"]: p["answer"] for p in probes[cid].get("probes") or () if p.get("answer") is not None}

    spec = [c for c in probes if is_speculative((configs.get(c) or {}).get("flags", {}))]
    ar = [c for c in probes if c not in spec]
    rows = []
    for s in spec:
        base = next((a for a in ar if model(a) == model(s)), None)
        if base is None:
            continue
        r = answer_mismatch_rate(answers(s), answers(base))
        rows.append({"config_id": s, "autoregressive": base, **r})
    return rows


def needle_for_point(run_dir: Path, config_id: str, prompt_tokens: int) -> float | None:
    """The needle accuracy of the configuration's probes at the point's prompt length (None: not probed)."""
    p = probes_path(run_dir, config_id)
    if not p.is_file():
        return None
    score = NeedleProbesFile.load(p).lengths.get(str(prompt_tokens))
    return None if score is None else score.needle_accuracy
