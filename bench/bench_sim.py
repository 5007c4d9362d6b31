"""How much the emulator carries on ONE core, and how late its chunk writes are against the engine's schedule.

    .venv/bin/python bench/bench_sim.py [--streams 1000] [--lateness-streams 500] [--tokens 300]

The emulator runs pinned to core 0 (`taskset -c 0`) with ground truth on; this script is the client, pinned to
core 1: raw asyncio sockets that only drain bytes (no SSE parsing), so the client is not the bottleneck. Figures:
- throughput run: N concurrent streams (all open at once), tokens/s the emulator emitted (from its ground truth:
  tokens of all chunks over first-to-last write), chunks/s, and whether all streams completed;
- lateness run: M streams; per chunk, write time minus the engine's scheduled emission time (`sched_ns`), p50/p99/max;
- both: the emulator's CPU seconds (user/system, from /proc) per chunk and as a share of the wall time: on a shared
  machine a share well below 1 means the emulator waited for the core, not for its own work.
The model is Llama-3.1-8B on the H200 profile; `--speedup` divides step times so the engine asks for more tokens/s
than the target (the emulator must keep up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from servesweep.sim.launch import start_sim

END = b"0\r\n\r\n"


class Drain(asyncio.Protocol):
    def __init__(self, done: asyncio.Future):
        self.done = done
        self.nbytes = 0
        self.tail = b""

    def data_received(self, data):
        self.nbytes += len(data)
        self.tail = (self.tail + data)[-8:]
        if self.tail.endswith(END) and not self.done.done():
            self.done.set_result(self.nbytes)

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(-self.nbytes)


async def drive(host: str, port: int, n: int, tokens: int, prompt_words: int) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    prompt = " ".join(["alpha"] * prompt_words)
    futs = []
    transports = []
    # open every connection first, then send all requests at once: N concurrent streams
    for i in range(n):
        done = loop.create_future()
        tr, _ = await loop.create_connection(lambda d=done: Drain(d), host, port)
        body = json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": f"{i} {prompt}"}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        req = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        futs.append(done)
        transports.append((tr, req))
    t0 = time.monotonic()
    for tr, req in transports:
        tr.write(req)
    res = await asyncio.gather(*futs)
    for tr, _ in transports:
        tr.close()
    ok = sum(1 for r in res if r > 0)
    return ok, time.monotonic() - t0


def run_point(n: int, tokens: int, speedup: float, prompt_words: int, prefix: list[str]) -> dict:
    gt = Path(tempfile.mkdtemp(prefix="bench-sim-")) / "gt.jsonl"
    args = [
        "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--max-running-requests", str(max(n, 64)),
        "--sim-calibration", f"speedup={speedup}", "--log-level", "warning",
    ]  # fmt: skip
    with start_sim(args, ground_truth=gt, prefix=prefix) as sim:
        import uvloop

        cpu0 = proc_cpu(sim.pid)
        ok, wall = uvloop.run(drive(sim.host, sim.port, n, tokens, prompt_words))
        cpu1 = proc_cpu(sim.pid)
        time.sleep(1.5)  # ground truth is flushed every second
        lines = sim.read_ground_truth()
    writes = [c[0] for ln in lines for c in ln["chunks"]]
    toks = sum(c[1] for ln in lines for c in ln["chunks"])
    span = (max(writes) - min(writes)) / 1e9 if writes else float("nan")
    late = [
        (c[0] - s) / 1e6
        for ln in lines
        if ln.get("sched_ns")
        for c, s in zip(ln["chunks"], ln["sched_ns"], strict=False)
        if s is not None
    ]
    late.sort()

    def pct(p):
        return late[min(len(late) - 1, int(p * len(late)))] if late else float("nan")

    user, sys_ = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return {
        "streams": n,
        "emulator_cpu_s": {
            "user": round(user, 2),
            "sys": round(sys_, 2),
            "of_wall": round((user + sys_) / wall, 2),
        },
        "cpu_us_per_chunk": round(1e6 * (user + sys_) / max(1, len(writes)), 2),
        "tokens_per_cpu_s": round(toks / (user + sys_))
        if user + sys_
        else None,  # what one dedicated core carries
        "completed": ok,
        "tokens": toks,
        "chunks": len(writes),
        "span_s": round(span, 3),
        "tokens_per_s": round(toks / span) if span else None,
        "chunks_per_s": round(len(writes) / span) if span else None,
        "client_wall_s": round(wall, 3),
        "lateness_ms_p50": round(pct(0.50), 3),
        "lateness_ms_p99": round(pct(0.99), 3),
        "lateness_ms_max": round(late[-1], 3) if late else None,
    }


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, from /proc (Linux)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(f[11]) / tick, int(f[12]) / tick


def ready_time(prefix: list[str]) -> float:
    """Seconds from launching `python -m servesweep.sim` (default load time) to /health 200."""
    t0 = time.monotonic()
    with start_sim(["--model-path", "meta-llama/Llama-3.1-8B-Instruct"], prefix=prefix):
        return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--lateness-streams", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=300, help="output tokens per stream")
    ap.add_argument("--prompt-words", type=int, default=20)
    ap.add_argument("--speedup", type=float, default=3.0, help="divides the engine's step times")
    ap.add_argument("--lateness-speedup", type=float, default=1.0)
    ap.add_argument(
        "--nice", type=int, default=0, help="run the emulator at this nice level (negative: root only)"
    )
    a = ap.parse_args()
    prefix = ["taskset", "-c", "0"]
    if a.nice:
        prefix = ["nice", "-n", str(a.nice), *prefix]
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    out = {"ready_s": round(ready_time(prefix), 3), "loadavg_before": os.getloadavg()[0]}
    out["throughput"] = run_point(a.streams, a.tokens, a.speedup, a.prompt_words, prefix)
    out["lateness"] = run_point(a.lateness_streams, a.tokens, a.lateness_speedup, a.prompt_words, prefix)
    out["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
