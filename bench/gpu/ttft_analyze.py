"""Join the server-side record (bench/gpu/ttft_middleware.py) with both clients' results, per run of
bench/gpu/ttft_compare.sh, and print/write the comparison.

    python3 bench/gpu/ttft_analyze.py RESULTS_DIR   # reads runs.jsonl, server.jsonl, sg-*.jsonl, ss-*/ records

Per run: the server's TTFT (first chunk with content − arrival of the request), the client's TTFT, their
difference per request where the client names its requests (servesweep's X-Request-Id), how the requests arrived
(spread of arrivals, TCP connections), and the first-token "staircase" (first-token times grouped within 5 ms).
A client's warm-up or probe request (one that ended before the run's median arrival) is left out.
"""

import glob
import json
import statistics
import sys
from pathlib import Path


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(xs):
    return {"n": len(xs), "p50": pct(xs, 50), "p99": pct(xs, 99), "min": min(xs) if xs else None,
            "max": max(xs) if xs else None}


def steps(times_ms, gap=5.0):
    """First-token moments: sorted times grouped when within `gap` ms of the previous; (time, size) per group."""
    out = []
    for t in sorted(times_ms):
        if out and t - out[-1][2] <= gap:
            out[-1][1] += 1
            out[-1][2] = t
        else:
            out.append([t, 1, t])
    return [(round(a, 1), n) for a, n, _ in out]


def servesweep_records(folder):
    import pyarrow.parquet as pq

    recs = []
    for f in glob.glob(f"{folder}/**/records.parquet", recursive=True):
        t = pq.read_table(f, columns=["request_id", "warmup", "sent_ns", "first_token_ns", "error_class",
                                      "completion_tokens", "prompt_tokens"]).to_pylist()
        recs += t
    return recs


def analyze(d: Path) -> dict:
    runs = [json.loads(x) for x in (d / "runs.jsonl").read_text().splitlines() if x.strip()]
    server = [json.loads(x) for x in (d / "server.jsonl").read_text().splitlines() if x.strip()]
    out = {}
    for run in runs:
        name, t0, t1 = run["name"], run["t0_ns"], run["t1_ns"]
        srv = [r for r in server if t0 <= r["arr_ns"] <= t1 and r["status"] == 200]
        if not srv:
            out[name] = {"error": "no server records"}
            continue
        med_arr = statistics.median(r["arr_ns"] for r in srv)
        main = [r for r in srv if r["end_ns"] > med_arr and r["content_ns"]]
        left_out = len(srv) - len(main)
        a0 = min(r["arr_ns"] for r in main)
        s_ttft = [(r["content_ns"] - r["arr_ns"]) / 1e6 for r in main]
        res = {
            "client": run["client"], "concurrency": run["concurrency"], "requests": len(main),
            "left_out_warmup_or_probe": left_out,
            "server_ttft_ms": stats(s_ttft),
            "server_body_read_ms": stats([(r["body_ns"] - r["arr_ns"]) / 1e6 for r in main]),
            "server_role_chunk_ms": stats([(r["chunks_ns"][0] - r["arr_ns"]) / 1e6 for r in main if r["chunks_ns"]]),
            "arrival_spread_ms": (max(r["arr_ns"] for r in main) - a0) / 1e6,
            "connections": len({tuple(r["peer"]) for r in main}),
            "body_keys": sorted({",".join(r["keys"] or []) for r in main}),
            "rewritten": sorted({",".join(r["rewritten"]) for r in main if r["rewritten"]}),
            "user_agent": sorted({r["ua"] or "" for r in main}),
            "chunks_per_request": stats([len(r["chunks_ns"]) for r in main]),
            "first_token_steps_ms_from_first_arrival": steps([(r["content_ns"] - a0) / 1e6 for r in main]),
            "arrivals_ms_from_first": sorted(round((r["arr_ns"] - a0) / 1e6, 1) for r in main),
        }
        if run["client"] == "servesweep":
            recs = [r for r in servesweep_records(d / run["dir"]) if not r["warmup"] and r["first_token_ns"]]
            by = {r["xrid"]: r for r in main}
            c_ttft = [(r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in recs]
            pairs = [(r, by[r["request_id"]]) for r in recs if r["request_id"] in by]
            res["client_ttft_ms"] = stats(c_ttft)
            res["paired"] = len(pairs)
            res["client_minus_server_ttft_ms"] = stats(
                [((c["first_token_ns"] - c["sent_ns"]) - (s["content_ns"] - s["arr_ns"])) / 1e6 for c, s in pairs])
            res["sent_to_arrival_ms"] = stats([(s["arr_ns"] - c["sent_ns"]) / 1e6 for c, s in pairs])
            res["first_token_to_client_ms"] = stats([(c["first_token_ns"] - s["content_ns"]) / 1e6 for c, s in pairs])
            res["client_send_spread_ms"] = (max(r["sent_ns"] for r in recs) - min(r["sent_ns"] for r in recs)) / 1e6
            res["completion_tokens"] = sorted({r["completion_tokens"] for r in recs})
            res["prompt_tokens"] = sorted({r["prompt_tokens"] for r in recs})
        else:
            j = json.loads((d / run["file"]).read_text().splitlines()[-1])
            c_ttft = [t * 1000 for t, e in zip(j["ttfts"], j.get("errors") or [""] * len(j["ttfts"]), strict=False) if t and not e]
            res["client_ttft_ms"] = stats(c_ttft)
            res["client_reported"] = {k: j.get(k) for k in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                                                            "output_throughput", "completed", "total_input_tokens",
                                                            "total_output_tokens")}
            # No ids: pair by rank (the i-th shortest client TTFT with the i-th shortest server TTFT).
            cs, ss = sorted(c_ttft), sorted(s_ttft)
            if len(cs) == len(ss):
                res["client_minus_server_ttft_ms_by_rank"] = stats([c - s for c, s in zip(cs, ss, strict=True)])
        out[name] = res
    return out


def table(res: dict) -> str:
    rows = ["| run | client | c | n | client TTFT p50 / p99 ms | server TTFT p50 / p99 ms | client − server p50 / max ms"
            " | arrivals spread ms | connections | first-token steps |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        if "error" in r:
            rows.append(f"| {name} | {r['error']} |")
            continue
        diff = r.get("client_minus_server_ttft_ms") or r.get("client_minus_server_ttft_ms_by_rank") or {}
        c, s = r["client_ttft_ms"], r["server_ttft_ms"]
        f = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
        g = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
        rows.append(f"| {name} | {r['client']} | {r['concurrency']} | {r['requests']} | {f(c['p50'])} / {f(c['p99'])}"
                    f" | {f(s['p50'])} / {f(s['p99'])} | {g(diff.get('p50'))} / {g(diff.get('max'))}"
                    f" | {r['arrival_spread_ms']:.1f} | {r['connections']} | "
                    f"{len(r['first_token_steps_ms_from_first_arrival'])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    d = Path(sys.argv[1])
    res = analyze(d)
    (d / "analysis.json").write_text(json.dumps(res, indent=1))
    print(table(res))
    for name, r in res.items():
        if "error" not in r:
            print(f"\n{name}: steps {r['first_token_steps_ms_from_first_arrival']}")
            print(f"  keys {r['body_keys']} rewritten {r['rewritten']} ua {r['user_agent']}")
            print(f"  role chunk {r['server_role_chunk_ms']}, body read {r['server_body_read_ms']}")
            for k in ("sent_to_arrival_ms", "first_token_to_client_ms", "client_send_spread_ms", "client_reported",
                      "completion_tokens", "prompt_tokens", "chunks_per_request"):
                if k in r:
                    print(f"  {k}: {r[k]}")
