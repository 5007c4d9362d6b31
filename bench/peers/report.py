"""Render the harness's results dict as Markdown: one table per figure, each with the ratio to the best peer."""

from __future__ import annotations


def _f(v, spec=".1f") -> str:
    return "–" if v is None else format(v, spec)


def _clean(err) -> str:
    return (err or "").replace("|", "/").replace("\n", " ")[:200]


def _ratio(mine, best) -> str:
    if mine is None or best in (None, 0):
        return "–"
    return f"{mine / best:.2f}×"


def _best_peer(rows: list[dict], key) -> float | None:
    # servesweep itself and its variants (experiments, worker runs) are never the baseline
    vals = [key(r) for r in rows if not r["tool"].startswith("servesweep") and key(r) is not None]
    return min(vals) if vals else None


def _acc(r: dict, metric: str, q: str):
    a = r.get("acc_pattern") or {}
    m = a.get(metric) or {}
    return m.get(q)


def render(res: dict) -> str:
    L: list[str] = []
    m = res["machine"]
    L += [
        "# servesweep against its peers",
        "",
        f"- command: `{res['command']}`",
        f"- date: {res['date_utc']}; wall {res.get('wall_s')} s",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}; load average at start {m['load_avg_at_start']} (shared with other work)",
        f"- pinning: emulator on CPU 0, client on CPU 1 (`taskset`): {'yes' if res['pinned'] else 'NO'}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()),
        f"- servesweep source: commit {res.get('servesweep_git', 'unknown')}",
        f"- emulator: `servesweep sim --model-path {res['emulator']['model']}`, decode calibration "
        f"`{res['emulator']['decode_calibration']}`; long context `{res['emulator']['long_calibration']}`",
        f"- workload: closed loop, {res['shape']['prompt_tokens']} prompt / {res['shape']['output_tokens']} "
        "output tokens, streaming chat completions, a fresh emulator per run",
        "- method, pairing caveats, install notes and findings: `bench/peers/README.md`. TTFT errors of peers "
        "paired by pattern are noisy (a twin with the same chunk pattern may have another TTFT); exact rows are "
        "the reference.",
        "",
    ]
    hist = res.get("history") or []
    if len(hist) > 1:
        L += [
            "Merged from these runs (a partial rerun replaces the entries it measured; each row's date and load "
            "average are in raw/peers.json):",
            "",
        ]
        L += [
            f"- `{h['command']}` at {h['date_utc']}, load average {h.get('load_avg')}, wall {h.get('wall_s')} s"
            for h in hist
        ]
        L += [""]
    if res.get("install"):
        L += ["Peer environments: " + "; ".join(f"{k}: {v}" for k, v in res["install"].items()), ""]
    all_runs = res["runs"]
    runs = [r for r in all_runs if not r.get("ladder_only")]  # figures 1-2: the --streams points
    conc = sorted({r["concurrency"] for r in runs})

    L += [
        "## 1. Client CPU per streamed chunk (steady window)",
        "",
        "User+sys CPU of the client's whole process tree while ≥ 90 % of the streams were open, ÷ chunks the "
        "emulator wrote in that window. Gap = the emulator's actual chunk spacing (ground truth), p50/p99.",
        "",
        "| streams | tool | µs/chunk | ratio to best peer | client core busy | most streams open | gap p50/p99 ms | "
        "server prompt/output tokens p50 | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in conc:
        rows = [r for r in runs if r["concurrency"] == c]
        best = _best_peer(rows, lambda r: r.get("cpu_us_per_chunk"))
        for r in rows:
            g = r.get("emulator_gap_ms") or {}
            L.append(
                f"| {c} | {r['tool']} | {_f(r.get('cpu_us_per_chunk'))} | "
                f"{_ratio(r.get('cpu_us_per_chunk'), best)} | {_f(r.get('steady_cpu_util'), '.0%')} | "
                f"{r.get('max_open_streams', '–')} | "
                f"{_f(g.get('p50'))}/{_f(g.get('p99'))} | {r.get('server_prompt_tokens_p50', '–')}/"
                f"{r.get('server_completion_tokens_p50', '–')} | {_clean(r.get('error'))} |"
            )
    L += [
        "",
        "## 2. Timing accuracy against ground truth (absolute error, ms)",
        "",
        "Chunk = |arrival after the first chunk − write after the first write|; TTFT = client TTFT − emulator TTFT "
        "(includes the upload and the emulator's read). Peers paired by chunk pattern (a lower bound on their "
        "error), servesweep both by pattern and by its X-Request-Id (exact), plus its absolute |arrival − write| "
        "on the shared monotonic clock.",
        "",
        "Clock: where the tool's arrival stamps come from. servesweep's records say it per request: `kernel` = the "
        "socket's receive time stamp (SO_TIMESTAMPNS) of the read that completed the line, `user` = "
        "`time.monotonic_ns()` after the read; read lag = user-space stamp − kernel stamp, p99/max over requests "
        "(how late the reader was). The peers stamp in user space after their read.",
        "",
        "| streams | tool | clock | paired | chunk p50 | chunk p99 | ratio p99 to best peer | TTFT p50 | TTFT p99 | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in conc:
        rows = [r for r in runs if r["concurrency"] == c]
        # tools that keep only the last chunk are not comparable per chunk: not a baseline
        best = _best_peer(
            [r for r in rows if not (r.get("acc_pattern") or {}).get("last_chunk_only")],
            lambda r: _acc(r, "chunk_err_ms", "p99"),
        )
        for r in rows:
            for by in ("pattern", "id", "response_id"):
                a = r.get(f"acc_{by}")
                if not a:
                    continue
                ch, tt, ab = (
                    a.get("chunk_err_ms") or {},
                    a.get("ttft_err_ms") or {},
                    a.get("abs_chunk_err_ms") or {},
                )
                label = r["tool"] + ("" if by == "pattern" else f" (by {by.replace('_', ' ')}, exact)")
                note = "last chunk only" if a.get("last_chunk_only") else ""
                if ab:
                    note = f"abs arrival−write p50/p99 {_f(ab.get('p50'), '.3f')}/{_f(ab.get('p99'), '.3f')}"
                    fi, la = a.get("abs_first_err_ms") or {}, a.get("abs_later_err_ms") or {}
                    if fi:
                        note += (
                            f"; first chunk p99 {_f(fi.get('p99'), '.3f')} ({_f(a.get('first_chunk_over_1ms'), '.1%')}"
                            f" of requests > 1 ms), later chunks p99 {_f(la.get('p99'), '.3f')}"
                        )
                    lag = r.get("read_lag_ms") or {}
                    if lag:
                        note += (
                            f"; read lag p99/max {_f(lag.get('p99'), '.2f')}/{_f(lag.get('p100'), '.2f')} ms"
                        )
                ratio = _ratio(ch.get("p99"), best) if by == "pattern" else ""
                L.append(
                    f"| {c} | {label} | {_clock(r)} | {a['paired']} | {_f(ch.get('p50'), '.3f')} | "
                    f"{_f(ch.get('p99'), '.3f')} | "
                    f"{ratio} | {_f(tt.get('p50'), '.2f')} | {_f(tt.get('p99'), '.2f')} | {note} |"
                )
    L += _figure3(all_runs, res.get("ladder") or {})
    long = res.get("long") or []
    if long:
        L += [
            "",
            "## 4. Long context: client TTFT against ground truth",
            "",
            "| tool | prompt tokens (server p50) | concurrency | paired | client TTFT p50 ms | emulator TTFT p50 ms | "
            "TTFT err p50 ms | TTFT err p99 ms | ratio p99 to best peer | launch → first full-size request s | error |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        # a tool whose prompts the server counted >5 % off the target ran another workload: not a baseline
        same = [
            r
            for r in long
            if r.get("server_prompt_tokens_p50")
            and abs(r["server_prompt_tokens_p50"] - r.get("prompt_tokens", 0))
            <= 0.05 * r.get("prompt_tokens", 1)
        ]
        best = _best_peer(same, lambda r: _acc(r, "ttft_err_ms", "p99"))
        for r in long:
            for by in ("pattern", "id", "response_id"):
                a = r.get(f"acc_{by}")
                if not a and by != "pattern":
                    continue
                a = a or {}
                tt = a.get("ttft_err_ms") or {}
                label = r["tool"] + ("" if by == "pattern" else f" (by {by.replace('_', ' ')}, exact)")
                L.append(
                    f"| {label} | {r.get('server_prompt_tokens_p50', '–')} | {r['concurrency']} | "
                    f"{a.get('paired', '–')} | {_f(r.get('client_ttft_ms_p50'), '.0f')} | "
                    f"{_f(r.get('server_ttft_ms_p50'), '.0f')} | {_f(tt.get('p50'), '.1f')} | {_f(tt.get('p99'), '.1f')} | "
                    f"{_ratio(tt.get('p99'), best) if by == 'pattern' else ''} | "
                    f"{_f(r.get('launch_to_first_full_prompt_s'), '.2f')} | {_clean(r.get('error'))} |"
                )
    L += _figure5(long, res.get("pool_build"))
    L += _figure6(res.get("workers") or [], all_runs)
    return "\n".join(L)


def _clock(r: dict) -> str:
    c = r.get("clock") or {}
    return ", ".join(f"{k} {v}" if len(c) > 1 or k in ("kernel", "user") else k for k, v in c.items()) or "–"


def _p99_exact(r: dict):
    """The figure-3 error: the exact pairing when the tool has one, else the pattern pairing (a lower bound)."""
    for by in ("id", "pattern"):
        a = r.get(f"acc_{by}") or {}
        v = (a.get("chunk_err_ms") or {}).get("p99")
        if v is not None and not a.get("last_chunk_only"):
            return v, by
    return None, None


def _figure3(runs: list[dict], ladder: dict) -> list[str]:
    L = [
        "",
        "## 3. Streams per worker process before the per-chunk p99 error exceeds 1 ms",
        "",
        "Per-chunk p99 error (ms) at each stream count, one worker process each (servesweep: exact pairing by "
        "request id; peers: pattern pairing, a lower bound). Tools that keep only the last chunk's arrival cannot "
        "be scored per chunk. A tool stops climbing the ladder after two points in a row above 1 ms (–).",
        "",
    ]
    tools = [
        t
        for t in dict.fromkeys(r["tool"] for r in runs)
        if any(_p99_exact(r)[0] is not None for r in runs if r["tool"] == t)
    ]
    pts = sorted({r["concurrency"] for r in runs if r["tool"] in tools})
    if not tools:
        return [*L, "No tool has a per-chunk figure in these results."]
    L += [
        "| tool | " + " | ".join(str(c) for c in pts) + " | streams before p99 > 1 ms | ratio to best peer |",
        "|---|" + "---|" * (len(pts) + 2),
    ]
    cap: dict[str, int | None] = {}
    for t in tools:
        by_c = {r["concurrency"]: _p99_exact(r)[0] for r in runs if r["tool"] == t}
        ok = None
        for c in sorted(by_c):
            if by_c[c] is None or by_c[c] > 1.0:
                break
            ok = c
        cap[t] = ok
    best = max((v for t, v in cap.items() if not t.startswith("servesweep") and v is not None), default=None)
    for t in tools:
        by_c = {r["concurrency"]: _p99_exact(r)[0] for r in runs if r["tool"] == t}
        cells = [_f(by_c.get(c), ".2f") if c in by_c else "–" for c in pts]
        mine = cap[t]
        if t == "servesweep" or t.startswith("servesweep-"):
            ratio = "–" if mine is None else (f"{mine / best:.1f}×" if best else "peers: none ≤ 1 ms")
        else:
            ratio = _ratio(mine, best) if mine is not None else "–"
        L.append(f"| {t} | " + " | ".join(cells) + f" | {mine if mine is not None else 'none'} | {ratio} |")
    # servesweep's own clock is shared with the emulator: its absolute error of every chunk after the first shows
    # what the kernel stamps give where a late first stamp (which shifts all offsets above) is left out
    later = {
        r["concurrency"]: ((r.get("acc_id") or {}).get("abs_later_err_ms") or {}).get("p99")
        for r in runs
        if r["tool"] == "servesweep"
    }
    if any(v is not None for v in later.values()):
        ok = None
        for c in sorted(later):
            if later[c] is None or later[c] > 1.0:
                break
            ok = c
        cells = [_f(later.get(c), ".2f") if c in later else "–" for c in pts]
        L.append(
            "| servesweep: absolute error, chunks after the first | "
            + " | ".join(cells)
            + f" | {ok if ok is not None else 'none'} | (no peer keeps absolute times) |"
        )
    return L


def _figure5(long: list[dict], pb: dict | None) -> list[str]:
    if not long and not pb:
        return []
    L = ["", "## 5. Prompt data for 64 × 100k tokens", ""]
    if pb:
        L += [
            f"- servesweep pool build (`build_bodies`, a fresh process, empty cache): cold "
            f"{_f((pb.get('cold') or {}).get('seconds'), '.2f')} s, warm (its disk cache) "
            f"{_f((pb.get('warm') or {}).get('seconds'), '.2f')} s for {(pb.get('cold') or {}).get('prompts')} "
            "prompts",
            "",
        ]
    if long:
        L += [
            "Launch → first full-size request at the emulator in the long-context run (figure 4): imports, "
            "tokenizer, data generation, any probe; what a user waits before the load starts.",
            "",
            "| tool | launch → first full-size request s | ratio to best peer | server prompt tokens p50 |",
            "|---|---|---|---|",
        ]
        ok = [r for r in long if r.get("launch_to_first_full_prompt_s") is not None]
        best = _best_peer(ok, lambda r: r.get("launch_to_first_full_prompt_s"))
        for r in long:
            v = r.get("launch_to_first_full_prompt_s")
            name = r["tool"] + (f" ({r['prompt_cache']})" if r.get("prompt_cache") else "")
            L.append(
                f"| {name} | {_f(v, '.2f')} | {_ratio(v, best)} | {r.get('server_prompt_tokens_p50', '–')} |"
            )
    return L


def _figure6(workers: list[dict], runs: list[dict]) -> list[str]:
    L = [
        "",
        "## 6. Scaling: 1 vs 2 worker processes",
        "",
    ]
    if workers:
        L += [
            "servesweep `--workers N --duration` (Locust master + N forked workers), the whole client tree on the "
            "client core: CPU per chunk of the whole tree and of each level (the `servesweep load` CLI, which waits and "
            "polls progress; the Locust master, which aggregates; the worker(s), which stream), and the accuracy, "
            "against the single-process run (`--workers 0`, figure 1) at the same stream count.",
            "",
            "| streams | client | µs/chunk total | CLI | Locust master | Locust worker(s) | processes with records | "
            "chunk p99 ms (exact) | clock | most streams open | error |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in sorted({r["concurrency"] for r in workers}):
            single = [r for r in runs if r["tool"] == "servesweep" and r["concurrency"] == c]
            for r in [*single, *[w for w in workers if w["concurrency"] == c]]:
                d = r.get("cpu_us_per_chunk_by_depth") or {}
                multi = r.get("workers")
                # depth 0: the `servesweep load` CLI; 1: Locust (the master with --workers); 2: forked workers
                master = d.get("1") if multi else None
                wk = d.get("2") if multi else d.get("1")
                label = (
                    "servesweep (one process)"
                    if not multi
                    else f"{r['tool']} (master + {multi} worker{'s' * (multi > 1)})"
                )
                L.append(
                    f"| {c} | {label} | "
                    f"{_f(r.get('cpu_us_per_chunk'))} | {_f(d.get('0'))} | {_f(master)} | {_f(wk)} | "
                    f"{r.get('client_processes_with_records', '–')} | {_f(_p99_exact(r)[0], '.2f')} | {_clock(r)} | "
                    f"{r.get('max_open_streams', '–')} | {_clean(r.get('error'))} |"
                )
    else:
        L += ["Not measured in these results (`--figures 6`).", ""]
    L += [
        "",
        "Projection to a larger machine: a worker process costs C_w µs per chunk (workers column) and keeps the "
        "figure-3 accuracy up to S streams; the master costs C_m µs per chunk of ALL workers. With K cores for "
        "the client: K − 1 workers (one core for the master), streams ≈ (K − 1) × S, as long as the master's "
        "load (K − 1) × S × chunks/s per stream × C_m stays well under one core (else a second master host). "
        "Capacity of 2 real cores (aggregate chunks/s, ≥ 1.8× one worker): `bench/bench_workers.py` (BENCHMARKS.md, "
        '"Distributed load: worker processes").',
        "",
    ]
    return L
