"""How long prompt pools take to build: cold (a fresh process, empty disk cache) and from the disk cache.

    .venv/bin/python bench/bench_prompts.py [--prompt-tokens 100000] [--n 64] [--tokenizer SPEC ...] [--pin CORE]
        [--src DIR ...] [--repeat N] [--verify]

Each measurement runs in a fresh process with an empty cache directory: cold = load the tokenizer, build the
sentence bank, compose and check the pool, write its cache file; then, in the same process, the pool from the disk
cache (warm_s) and every request body (bodies_s). warm_process_s: a second fresh process that reads the cached pool
and makes the bodies, all from its start (imports included): what a Locust process does before its first request. `--tokenizer` (repeat
it): "qwen3.6" (built in), or a tokenizer.json / model directory, e.g. the peer harness's word-level one
(bench/.peers-venv/tokenizer) or a real byte-level BPE built by `bench/gpu/build_tokenizer.py DIR`. `--src DIR`
(repeat it): also measure the servesweep sources under DIR (e.g. an older commit: `git archive COMMIT src | tar -x
-C DIR`), alternating with the working tree, so a before/after comparison shares one noisy machine. `--pin CORE`:
each build on one core (as the peer harness pins its client). `--verify`: afterwards count every prompt in full.
`--launch`: instead, `servesweep load` against the emulator (pinned to the other core with `--pin 0|1`), cold then
warm cache: seconds from launch to the first full-size request the emulator received.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in the measured process: only APIs that older sources have too (build_pool, load_tokenizer, _bank).
CHILD = r"""
import json, os, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from pathlib import Path
from servesweep.workload.prompts import _bank, build_pool
from servesweep.workload.tokenizer import load_tokenizer
a = json.loads(sys.argv[1])
cache = Path(a["cache"])
t_imp = time.perf_counter() - t0
if a.get("warm"):  # what a Locust process does after `servesweep load` built the pool: read it, make the bodies
    pool = build_pool(a["tokens"], a["n"], tokenizer=a["tokenizer"], cache_dir=cache, endpoint=a["endpoint"])
    pool.bodies("bench", 256, extra={"ignore_eos": True})
    print(json.dumps({"warm_process_s": time.perf_counter() - t0}))
    sys.exit()
tok = load_tokenizer(a["tokenizer"])
t_tok = time.perf_counter() - t0
_bank(tok, cache)
t_bank = time.perf_counter() - t0
pool = build_pool(a["tokens"], a["n"], tokenizer=a["tokenizer"], cache_dir=cache, endpoint=a["endpoint"])
t_cold = time.perf_counter() - t0
cpu = time.process_time() - c0
t1 = time.perf_counter()
again = build_pool(a["tokens"], a["n"], tokenizer=a["tokenizer"], cache_dir=cache, endpoint=a["endpoint"])
t_warm = time.perf_counter() - t1
assert [p.as_text() for p in again] == [p.as_text() for p in pool]
t2 = time.perf_counter()
bodies = again.bodies("bench", 256, extra={"ignore_eos": True})
t_bodies = time.perf_counter() - t2
print(json.dumps({
    "imports_s": t_imp, "tokenizer_s": t_tok - t_imp, "bank_s": t_bank - t_tok, "compose_check_save_s": t_cold - t_bank,
    "cold_s": t_cold, "cold_cpu_s": cpu, "warm_s": t_warm, "bodies_s": t_bodies,
    "cache_mb": sum(f.stat().st_size for f in cache.iterdir()) / 1e6,
    "body_mb": sum(len(h) + len(t) for h, t in bodies) / 1e6,
    "tokens": sorted({p.tokens for p in pool}),
}))
"""


def measure(src: Path, tokenizer: str, args) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="bench-prompts-"))
    try:
        env = dict(os.environ, PYTHONPATH=str(src), HOME=str(cache))  # no user cache of any kind is read
        a = {
            "cache": str(cache / "prompts"),
            "tokenizer": tokenizer,
            "tokens": args.prompt_tokens,
            "n": args.n,
            "endpoint": args.endpoint,
        }
        cmd = [sys.executable, "-c", CHILD, json.dumps(a)]
        if args.pin is not None:
            cmd = ["taskset", "-c", str(args.pin), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            return {"error": r.stderr.strip()[-600:]}
        out = json.loads(r.stdout.strip().splitlines()[-1])
        r = subprocess.run(
            [*cmd[:-1], json.dumps(a | {"warm": True})], capture_output=True, text=True, env=env
        )
        if r.returncode != 0:
            return {"error": r.stderr.strip()[-600:]}
        out |= json.loads(r.stdout.strip().splitlines()[-1])
        if args.verify:
            from servesweep.workload.prompts import build_pool, verify_pool

            pool = build_pool(
                args.prompt_tokens, args.n, tokenizer=tokenizer, cache_dir=a["cache"], endpoint=args.endpoint
            )
            out["off_prompts"] = len(verify_pool(pool))
        return out
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def launch(src: Path, tokenizer: str, args) -> dict:
    """`servesweep load` at the emulator (concurrency 32, `--n` requests of `--prompt-tokens`), cold then warm
    cache: seconds from launch to the first full-size request the emulator received (its ground truth)."""
    from servesweep.sim.launch import start_sim

    home = Path(tempfile.mkdtemp(prefix="bench-prompts-home-"))
    out: dict = {}
    try:
        for label in ("cold", "warm"):
            work = Path(tempfile.mkdtemp(prefix="bench-prompts-load-"))
            sim = ["--model-path", "Qwen/Qwen3.6-27B", "--served-model-name", "m"]
            sim += ["--context-length", str(args.prompt_tokens + 4096)]
            sim += [
                "--sim-calibration",
                "speedup=20,eos_median_tokens=1000000000",
            ]  # as the peer harness's figure 4
            if tokenizer != "qwen3.6":
                sim += ["--tokenizer-path", tokenizer]
            prefix = ["taskset", "-c", str(1 - args.pin)] if args.pin in (0, 1) else None
            with start_sim(sim, ground_truth=work / "gt.jsonl", prefix=prefix, timeout=120) as s:
                cmd = [
                    sys.executable,
                    "-m",
                    "servesweep.cli",
                    "load",
                    "--base-url",
                    s.base_url,
                    "--model",
                    "m",
                ]
                cmd += [
                    "--concurrency",
                    "32",
                    "--prompt-tokens",
                    str(args.prompt_tokens),
                    "--output-tokens",
                    "8",
                ]
                cmd += [
                    "--requests",
                    str(args.n),
                    "--tokenizer",
                    tokenizer,
                    "--out",
                    str(work / "run"),
                    "--json",
                ]
                if args.pin is not None:
                    cmd = ["taskset", "-c", str(args.pin), *cmd]
                env = dict(os.environ, HOME=str(home), PYTHONPATH=str(src))
                t0 = time.monotonic_ns()  # the emulator stamps CLOCK_MONOTONIC too
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            gt = [json.loads(line) for line in (work / "gt.jsonl").read_text().splitlines() if line.strip()]
            shutil.rmtree(work, ignore_errors=True)
            big = [g for g in gt if (g.get("prompt_tokens") or 0) >= args.prompt_tokens // 2]
            if r.returncode != 0 or not big:
                return {"error": f"{label}: exit {r.returncode}: {r.stderr.strip()[-400:]}"}
            out[f"launch_{label}_s"] = (min(g["recv_ns"] for g in big) - t0) / 1e9
            out["server_prompt_tokens"] = sorted({g["prompt_tokens"] for g in big})
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--endpoint", default="chat", choices=["chat", "completions"])
    ap.add_argument(
        "--tokenizer", action="append", help="qwen3.6 or a tokenizer.json / directory (repeatable)"
    )
    ap.add_argument(
        "--src", action="append", type=Path, default=[], help="other servesweep sources (repeatable)"
    )
    ap.add_argument("--pin", type=int, default=None, help="run each build on this CPU core")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (the median is printed)")
    ap.add_argument("--verify", action="store_true", help="count every prompt in full afterwards")
    ap.add_argument(
        "--launch",
        action="store_true",
        help="instead: launch -> first full-size request of `servesweep load` at the emulator, cold and warm",
    )
    args = ap.parse_args()
    srcs = [ROOT / "src", *[s.resolve() for s in args.src]]
    for s in srcs:
        if not (s / "servesweep" / "prompts.py").is_file():
            ap.error(f"--src {s}: no servesweep/workload/prompts.py under it")
    tokenizers = args.tokenizer or ["qwen3.6"]
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeat):
        for tok in tokenizers:
            for s in srcs:  # alternate the sources so that both see the same moments of a noisy machine
                run = launch if args.launch else measure
                results.setdefault((tok, str(s)), []).append(run(s, tok, args))
    if args.launch:
        print(
            f"launch -> first full-size request, {args.n} x {args.prompt_tokens} tokens at concurrency 32, median"
        )
        print(
            "| tokenizer | sources | cold s | warm s | prompt tokens at the emulator |\n|---|---|---|---|---|"
        )
        for (tok, s), runs in results.items():
            ok = [r for r in runs if "error" not in r]
            label = "working tree" if s == str(ROOT / "src") else s
            if not ok:
                print(f"| {tok} | {label} | error: {runs[0]['error']} |")
                continue
            cold, warm = (statistics.median(r[k] for r in ok) for k in ("launch_cold_s", "launch_warm_s"))
            print(f"| {tok} | {label} | {cold:.2f} | {warm:.2f} | {ok[-1]['server_prompt_tokens']} |")
        return
    load = os.getloadavg()[0]
    pin = f"pinned to core {args.pin}" if args.pin is not None else "not pinned"
    print(
        f"{args.n} prompts × {args.prompt_tokens} tokens ({args.endpoint}), median of {args.repeat} round(s), "
        f"{pin}; load average {load:.1f} on {os.cpu_count()} cores"
    )
    keys = [
        "cold_s",
        "cold_cpu_s",
        "tokenizer_s",
        "bank_s",
        "compose_check_save_s",
        "warm_s",
        "bodies_s",
        "warm_process_s",
    ]
    print("| tokenizer | sources | " + " | ".join(keys) + " | cache MB | prompt tokens | off |")
    print("|---" * (len(keys) + 5) + "|")
    for (tok, s), runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            print(f"| {tok} | {s} | error: {runs[0]['error']} |")
            continue
        med = {k: statistics.median(r[k] for r in ok) for k in keys}
        cells = " | ".join(f"{med[k]:.2f}" for k in keys)
        off = ok[-1].get("off_prompts", "–")
        label = "working tree" if s == str(ROOT / "src") else s
        print(f"| {tok} | {label} | {cells} | {ok[-1]['cache_mb']:.1f} | {ok[-1]['tokens']} | {off} |")


if __name__ == "__main__":
    main()
