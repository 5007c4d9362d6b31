"""The answers of a run, for docs/gpu-validation.md's "Answers of a random-weight model": from every records.parquet
under the given folders, each measured response's text (cut), its degeneration verdict with reasons and the
measures that drove it, and the expected needle with score_needle's verdict; then the needle probes (answers/*.json
of a `servesweep run` folder, or a probe file written by `--probe`) with their answers cut. One JSON to stdout.

Usage:
  python bench/gpu/answer_samples.py DIR [DIR ...] [--chars 400] [--per-point 4]
  python bench/gpu/answer_samples.py --probe EXPERIMENT.yaml BASE_URL LENGTH=OUT_TOKENS ... > probes.json
    (the probe module directly, matrix/answer_probes.py run_probes, against a server already running: the same
    prompts `servesweep run` sends, scored the same way)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cut(text: str | None, n: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= n else text[:n] + f"... [{len(text)} chars]"


def records(dirs: list[Path], chars: int, per_point: int) -> list[dict]:
    import pyarrow.parquet as pq

    from servesweep.results.answer_checks import degenerate

    keep = (
        "top_word_share",
        "top_3gram_share",
        "compression_ratio",
        "loop_period",
        "loop_reps",
        "loop_share",
        "char_loop_share",
        "repeated_line_share",
    )
    out = []
    for d in dirs:
        for f in sorted(d.rglob("records.parquet")):
            t = pq.read_table(f).to_pylist()
            n = 0
            for r in t:
                if r.get("warmup") or r.get("error_class") or n >= per_point:
                    continue
                n += 1
                text = r.get("response_text")
                bad, reasons, m = degenerate(text or "")
                out.append(
                    {
                        "file": str(f.relative_to(d.parent)),
                        "prompt_tokens": r.get("prompt_tokens"),
                        "completion_tokens": r.get("completion_tokens"),
                        "finish_reason": r.get("finish_reason"),
                        "degenerate": bad,
                        "reasons": reasons,
                        "measures": {k: m[k] for k in keep if k in m},
                        "text": _cut(text, chars),
                    }
                )
    return out


def probes(dirs: list[Path], chars: int) -> list[dict]:
    out = []
    for d in dirs:
        for f in sorted(d.rglob("answers/*.json")):
            data = json.loads(f.read_text())
            for p in data.get("probes", []):
                out.append({**p, "answer": _cut(p.get("answer"), chars), "file": str(f.relative_to(d.parent))})
            out.append({"file": str(f.relative_to(d.parent)), "lengths": data.get("lengths")})
    return out


def probe_direct(exp_path: str, base_url: str, specs: list[str]) -> dict:
    from servesweep.config.experiment import load_experiment
    from servesweep.matrix.answer_probes import run_probes

    exp = load_experiment(exp_path)
    lengths = {int(a): int(b) for a, b in (s.split("=") for s in specs)}
    return run_probes(exp, {}, lengths, base_url.rstrip("/"), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--chars", type=int, default=400)
    ap.add_argument("--per-point", type=int, default=4)
    ap.add_argument("--probe", nargs="+", metavar="ARG")
    a = ap.parse_args()
    if a.probe:
        json.dump(probe_direct(a.probe[0], a.probe[1], a.probe[2:]), sys.stdout, indent=1, ensure_ascii=False)
        return
    dirs = [Path(x) for x in a.dirs]
    json.dump(
        {"records": records(dirs, a.chars, a.per_point), "probes": probes(dirs, a.chars)},
        sys.stdout,
        indent=1,
        ensure_ascii=False,
    )


if __name__ == "__main__":
    main()
