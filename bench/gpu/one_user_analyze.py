"""The figures of bench/gpu/one_user.sh: does one user's stream of short answers stand for its long answers at the
same prompt (matrix/decision.py `share_one_user`)? Per output length: TTFT p50/p95 and TPOT p50 at concurrency 1;
and, within the long answers themselves, each request's decode speed over its first SHORT tokens against its whole
answer (the same requests: no run-to-run noise). The ratios are what the decision's derivation must get right: TTFT
long / short (should be 1: the prefill does not know the answer's length) and TPOT long / short (what the step
model's ratio carries: the longer context).

  python3 bench/gpu/one_user_analyze.py DIR --short 256 --long 2048 --out OUTDIR

DIR holds o<N>/<run>/<point>/{summary.json,records.parquet} (servesweep load --out DIR/o<N>). Writes
OUTDIR/one_user.json and prints a table."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pyarrow.parquet as pq


def point_dir(root: Path) -> Path:
    (summary,) = list(root.rglob("summary.json"))
    return summary.parent


def figures(d: Path) -> dict:
    s = json.loads((d / "summary.json").read_text())
    return {
        "requests": s["requests"],
        "ttft_ms": {k: s["ttft_ms"][k] for k in ("p50", "p95", "n")},
        "tpot_ms": {k: s["tpot_ms"][k] for k in ("p50", "p95", "n")},
        "decode_tokens_per_s_p50": s["decode_tokens_per_s"]["p50"],
        "prompt_tokens": s.get("prompt_tokens"),
    }


def head_tpot(d: Path, head: int) -> list[tuple[float, float]]:
    """Per request (not warm-up, no error): (TPOT over its first `head` tokens, TPOT over all), ms."""
    rows = pq.read_table(d / "records.parquet").to_pylist()
    out = []
    for r in rows:
        if r.get("warmup") or r.get("error_class") or not r.get("chunk_ns"):
            continue
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
    short, long_ = point_dir(root / f"o{a.short}"), point_dir(root / f"o{a.long}")
    fs, fl = figures(short), figures(long_)
    pairs = head_tpot(long_, a.short)
    doc = {
        "short": a.short,
        "long": a.long,
        "figures": {str(a.short): fs, str(a.long): fl},
        "ttft_p50_ratio": fl["ttft_ms"]["p50"] / fs["ttft_ms"]["p50"],
        "ttft_p95_ratio": fl["ttft_ms"]["p95"] / fs["ttft_ms"]["p95"],
        "tpot_p50_ratio": fl["tpot_ms"]["p50"] / fs["tpot_ms"]["p50"],
        "within_long": {
            "requests": len(pairs),
            "tpot_head_ms_p50": statistics.median(p[0] for p in pairs) if pairs else None,
            "tpot_all_ms_p50": statistics.median(p[1] for p in pairs) if pairs else None,
            "all_over_head": [round(p[1] / p[0], 4) for p in pairs],
        },
    }
    pt = fs["prompt_tokens"] or {}
    print(f"one user, {pt.get('mean', '?')}-token prompts (as the server counted them): {a.short}- vs {a.long}-token "
          "answers")
    print("| output | requests | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | decode tok/s p50 |")
    print("|---|---|---|---|---|---|")
    for o, f in ((a.short, fs), (a.long, fl)):
        print(f"| {o} | {f['ttft_ms']['n']} | {f['ttft_ms']['p50']:.1f} | {f['ttft_ms']['p95']:.1f} | "
              f"{f['tpot_ms']['p50']:.2f} | {f['decode_tokens_per_s_p50']:.1f} |")
    print(f"TTFT long/short: p50 {doc['ttft_p50_ratio']:.3f}, p95 {doc['ttft_p95_ratio']:.3f}; "
          f"TPOT p50 long/short {doc['tpot_p50_ratio']:.3f}")
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
