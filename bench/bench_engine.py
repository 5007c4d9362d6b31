"""CPU cost of the emulator engine's step at 1,000 running sequences (no HTTP; emit is a no-op counter).

    .venv/bin/python bench/bench_engine.py            # pin with: taskset -c 0 .venv/bin/python bench/bench_engine.py

Prints, per configuration: decode steps run, CPU microseconds per decode step and per sequence per step, and the
emitted tokens/s the engine alone could sustain on one core (its share of the emulator's per-core budget: the
HTTP side needs most of the CPU for >= 50,000 tokens/s).
"""

from __future__ import annotations

import argparse
import time

from servesweep.sglang.serverargs import resolve_server
from servesweep.sim.engine import Engine, EngineRequest


def run(label: str, args: dict, *, seqs: int, out_tokens: int, prompt: int = 64) -> dict:
    resolved = resolve_server(args)
    eng = Engine(resolved, seed=0)
    emitted = 0

    def emit(req: EngineRequest, n: int, finished: bool) -> None:
        nonlocal emitted
        emitted += n

    reqs = [
        EngineRequest(f"r{i}", list(range(i * prompt, (i + 1) * prompt)), out_tokens, emit, ignore_eos=True)
        for i in range(seqs)
    ]
    t0 = time.process_time()
    eng.run_simulated(reqs)
    cpu = time.process_time() - t0
    st = eng.stats()
    steps = st.counters["decode_steps"]
    pre = st.counters["prefill_steps"]
    return {
        "config": label,
        "seqs": seqs,
        "decode_steps": steps,
        "prefill_steps": pre,
        "tokens": emitted,
        "cpu_s": round(cpu, 3),
        "us_per_step": round(1e6 * cpu / max(1, steps + pre), 1),
        "us_per_seq_step": round(1e6 * cpu / max(1, steps + pre) / seqs, 3),
        "tokens_per_cpu_s": round(emitted / cpu),
        "emits_per_cpu_s": round((steps * seqs) / cpu),
    }


def run_realtime(seqs: int, out_tokens: int) -> dict:
    """The engine on a uvloop event loop in real time: emit lateness against the engine's own schedule."""
    import asyncio

    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    resolved = resolve_server(
        {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "sim_gpu": "H200", "max_running_requests": seqs}
    )
    eng = Engine(resolved, seed=0)
    late: list[float] = []
    emitted = 0
    done = loop.create_future()
    finished = 0

    def emit(req: EngineRequest, n: int, fin: bool) -> None:
        nonlocal emitted, finished
        late.append(time.monotonic() - eng.scheduled_time())
        emitted += n
        if fin:
            finished += 1
            if finished == seqs:
                done.set_result(True)

    async def main() -> float:
        eng.start(asyncio.get_running_loop())
        t0 = time.monotonic()
        for i in range(seqs):
            eng.submit(
                EngineRequest(f"r{i}", list(range(i * 64, i * 64 + 64)), out_tokens, emit, ignore_eos=True)
            )
        await done
        return time.monotonic() - t0

    c0 = time.process_time()
    wall = loop.run_until_complete(main())
    cpu = time.process_time() - c0
    loop.close()
    late.sort()
    return {
        "config": "real time, llama-8b h200, uvloop",
        "seqs": seqs,
        "wall_s": round(wall, 3),
        "engine_virtual_s": round(eng._vt, 3),
        "tokens_per_s": round(emitted / wall),
        "cpu_share": round(cpu / wall, 3),
        "lateness_p50_ms": round(1e3 * late[len(late) // 2], 3),
        "lateness_p99_ms": round(1e3 * late[int(len(late) * 0.99)], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=1000)
    ap.add_argument("--out", type=int, default=300)
    ns = ap.parse_args()
    configs = [
        (
            "llama-8b h200 (1 token/step)",
            {
                "model_path": "meta-llama/Llama-3.1-8B-Instruct",
                "sim_gpu": "H200",
                "max_running_requests": ns.seqs,
            },
        ),
        (
            "llama-8b h200 EAGLE3 (accept-length tokens/step)",
            {
                "model_path": "meta-llama/Llama-3.1-8B-Instruct",
                "sim_gpu": "H200",
                "speculative_algorithm": "EAGLE3",
                "speculative_draft_model_path": "draft",
                "max_running_requests": ns.seqs,
            },
        ),
    ]
    for label, args in configs:
        print(run(label, args, seqs=ns.seqs, out_tokens=ns.out))
    print(run_realtime(ns.seqs, ns.out))


if __name__ == "__main__":
    main()
