"""How long prompt pools take to build: cold (no disk cache, fresh process) and from the disk cache.

    .venv/bin/python bench/bench_prompts.py [--prompt-tokens 100000] [--n 64]

Issue 3 asks for 64 prompts of 100k tokens in ≤ 10 s cold. Cold includes loading the tokenizer and the sentence
bank; every prompt is encoded once more in full to check its length (as the emulator counts it).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--endpoint", default="chat", choices=["chat", "completions"])
    ap.add_argument("--shared-prefix-tokens", type=int, default=0)
    ap.add_argument("--num-groups", type=int, default=1)
    args = ap.parse_args()

    kw = dict(
        endpoint=args.endpoint, shared_prefix_tokens=args.shared_prefix_tokens, num_groups=args.num_groups
    )
    with tempfile.TemporaryDirectory() as d:  # an empty cache: a cold build
        t0, c0 = time.perf_counter(), time.process_time()
        from servesweep.prompts import _bank, build_pool
        from servesweep.tokenizer import load_tokenizer, render_chatml

        tok = load_tokenizer(None)  # the same cached instance build_pool uses
        _bank(tok, Path(d))
        t_setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        pool = build_pool(args.prompt_tokens, args.n, cache_dir=Path(d), **kw)
        t_build = time.perf_counter() - t1
        cpu_cold = time.process_time() - c0

        t2 = time.perf_counter()
        again = build_pool(args.prompt_tokens, args.n, cache_dir=Path(d), **kw)
        t_cached = time.perf_counter() - t2
        size = sum(f.stat().st_size for f in Path(d).iterdir())
    assert [p.as_text() for p in again] == [p.as_text() for p in pool]
    t3 = time.perf_counter()
    bodies = pool.bodies("bench", 256, extra={"ignore_eos": True})
    t_bodies = time.perf_counter() - t3

    # Independent check of every prompt's length, with a nonce filled in.
    nonce = next(pool.nonces()).decode()
    texts = [render_chatml(p.render(nonce)) if p.messages else p.render(nonce) for p in pool]
    counts = {len(ids) for ids in tok.encode_batch(texts)}
    print(
        f"{args.n} prompts × {args.prompt_tokens} tokens ({args.endpoint}): "
        f"tokenizer+bank {t_setup:.2f} s, build {t_build:.2f} s, cold total {t_setup + t_build:.2f} s "
        f"(CPU {cpu_cold:.2f} s, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores); "
        f"from disk cache {t_cached:.2f} s ({size / 1e6:.1f} MB); request bodies {t_bodies:.2f} s "
        f"({sum(len(h) + len(t) for h, t in bodies) / 1e6:.1f} MB); token counts seen {sorted(counts)}"
    )


if __name__ == "__main__":
    main()
