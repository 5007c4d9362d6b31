"""The figures of bench/gpu/one_user.sh: does one user's stream of short answers stand for its long answers at the
same prompt (matrix/decision.py `share_one_user`)? Per output length: TTFT p50/p95 and TPOT p50 at concurrency 1;
and, within the long answers themselves, each request's decode speed over its first SHORT tokens against its whole
answer (the same requests: no run-to-run noise). The ratios are what the decision's derivation must get right: TTFT
long / short (should be 1: the prefill does not know the answer's length) and TPOT long / short (what the step
model's ratio carries: the longer context).

  python3 bench/gpu/one_user_analyze.py DIR --short 256 --long 2048 --out OUTDIR

DIR holds o<N>/<run>/<point>/records.parquet (servesweep load --out DIR/o<N>; an interrupted point's
records.partial.parquet will do). Writes OUTDIR/one_user.json and prints a table."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pyarrow.parquet as pq


def records_of(root: Path) -> list[dict]:
    """The measured requests (no warm-up, no error) of the one point under `root`: its records.parquet, or the
    records.partial.parquet an interrupted point kept (the requests that finished before the deadline)."""
    files = list(root.rglob("records.parquet")) or list(root.rglob("records.partial.parquet"))
    if len(files) != 1:
        raise SystemExit(f"{root}: expected one point's records, found {[str(f) for f in files]}")
    rows = pq.read_table(files[0]).to_pylist()
    return [r for r in rows if not r.get("warmup") and not r.get("error_class") and r.get("chunk_ns")]


def figures(rows: list[dict]) -> dict:
    """Per request TTFT (send to first token) and TPOT (first to last token over the tokens after the first), ms;
    their medians and largest (too few requests for a p95)."""
    ttft = [(r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in rows]
    tpot = [(r["chunk_ns"][-1] - r["chunk_ns"][0]) / 1e6 / max(1, r["completion_tokens"] - 1) for r in rows]
    return {
        "requests": len(rows),
        "prompt_tokens": statistics.median(r["prompt_tokens"] for r in rows) if rows else None,
        "ttft_ms": {"p50": statistics.median(ttft), "max": max(ttft)} if rows else None,
        "tpot_ms": {"p50": statistics.median(tpot), "max": max(tpot)} if rows else None,
    }


def head_tpot(rows: list[dict], head: int) -> list[tuple[float, float]]:
    """Per request: (TPOT over its first `head` tokens, TPOT over all), ms."""
    out = []
    for r in rows:
        ns = r["chunk_ns"]
        toks = r.get("chunk_tokens") or [1] * len(ns)
        cum, k_head = 0, None
        for i, t in enumerate(toks):
            cum += t
            if k_head is None and cum >= head + 1:
                k_head = (i, cum)
        if k_head is None or cum <= head + 1:
            continue
        i, n_head = k_head
        first = toks[0]
        out.append(((ns[i] - ns[0]) / 1e6 / (n_head - first), (ns[-1] - ns[0]) / 1e6 / (cum - first)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--short", type=int, default=256)
    ap.add_argument("--long", type=int, default=2048)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    root = Path(a.dir)
    rs, rl = records_of(root / f"o{a.short}"), records_of(root / f"o{a.long}")
    fs, fl = figures(rs), figures(rl)
    pairs = head_tpot(rl, a.short)
    doc = {
        "short": a.short,
        "long": a.long,
        "figures": {str(a.short): fs, str(a.long): fl},
        "ttft_p50_ratio": fl["ttft_ms"]["p50"] / fs["ttft_ms"]["p50"],
        "tpot_p50_ratio": fl["tpot_ms"]["p50"] / fs["tpot_ms"]["p50"],
        "within_long": {
            "requests": len(pairs),
            "tpot_head_ms_p50": statistics.median(p[0] for p in pairs) if pairs else None,
            "tpot_all_ms_p50": statistics.median(p[1] for p in pairs) if pairs else None,
            "all_over_head": [round(p[1] / p[0], 4) for p in pairs],
        },
    }
    print(f"one user, {fs['prompt_tokens']}-token prompts (as the server counted them): {a.short}- vs {a.long}-token "
          "answers")
    print("| output | requests | TTFT p50 ms | TTFT max ms | TPOT p50 ms | TPOT max ms |")
    print("|---|---|---|---|---|---|")
    for o, f in ((a.short, fs), (a.long, fl)):
        print(f"| {o} | {f['requests']} | {f['ttft_ms']['p50']:.1f} | {f['ttft_ms']['max']:.1f} | "
              f"{f['tpot_ms']['p50']:.2f} | {f['tpot_ms']['max']:.2f} |")
    print(f"long/short: TTFT p50 {doc['ttft_p50_ratio']:.3f}, TPOT p50 {doc['tpot_p50_ratio']:.3f}")
    w = doc["within_long"]
    if pairs:
        print(f"within the {a.long}-token answers ({w['requests']} requests): TPOT over the first {a.short} tokens "
              f"{w['tpot_head_ms_p50']:.2f} ms, over all {w['tpot_all_ms_p50']:.2f} ms (per request all/first: "
              f"{w['all_over_head']})")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "one_user.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
