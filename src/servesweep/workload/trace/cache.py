"""The trace's ideal prefix cache: how many of each request's prompt tokens a radix cache of a given size serves.

Requests are taken in arrival order; each one's prompt is its chain of blocks (`hash_ids`). The cache holds blocks
keyed by their whole chain up to them (a radix tree's path, so an id only matches after the same prefix) and their
size; a request is served its longest cached leading run of blocks, less its last token, which a server always
computes (its logits sample the first output token). Then all its blocks are in the cache, and least recently
used blocks are evicted, leaves before their parents (as SGLang's radix cache and the emulator do), while the
cache holds more than `cache_tokens`.

Ideal, because it knows nothing of time: a request that arrives while the one it shares a prefix with is still in
prefill is counted as a hit here, and a server's cache shares its space with the running requests' KV.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence

from servesweep.workload.trace.model import Trace

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_MULT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_tokens(v: str | int | None) -> int | None:
    """A cache size in tokens: an integer, or text like 500k, 2M, 1.5G; None, "inf" or "unlimited": no limit."""
    if v is None or isinstance(v, int) and not isinstance(v, bool):
        if v is not None and v < 1:
            raise ValueError(f"cache size {v!r}: expected ≥ 1 token")
        return v
    if isinstance(v, str) and v.strip().lower() in ("inf", "unlimited", "none"):
        return None
    m = _SIZE.match(v) if isinstance(v, str) else None
    if not m or float(m[1]) <= 0:
        raise ValueError(f"cache size {v!r}: expected tokens, e.g. 500000, 500k, 2M (or 'inf')")
    return int(float(m[1]) * _MULT[m[2].lower()])


def ideal_cached_tokens(
    trace: Trace,
    cache_tokens: int | None = None,
    *,
    sent_ns: Sequence[int | None] | None = None,
    ready_ns: Sequence[int | None] | None = None,
) -> list[int]:
    """Per request (in `trace.requests` order): the prompt tokens an ideal radix cache of `cache_tokens` tokens
    (None: unlimited) serves it.

    Untimed (the trace's order, each request's blocks in the cache before the next one arrives), or, given when each
    request was sent (`sent_ns`) and when its prefill was done (`ready_ns`, e.g. its first token), timed: a request
    finds only the blocks of requests whose prefill was done when it was sent, as a server's radix cache holds a
    prompt's blocks from the end of its prefill. Unknown times (None): the request is left out of the cache."""
    n = len(trace.requests)
    if sent_ns is None:
        order = sorted(range(n), key=lambda i: trace.requests[i].timestamp_ms)
        events = [(k, 0, i) for k, i in enumerate(order)] + [(k, 1, i) for k, i in enumerate(order)]
        events.sort(key=lambda e: (e[0], e[1]))  # each request matches, then inserts, before the next
    else:
        if len(sent_ns) != n or ready_ns is None or len(ready_ns) != n:
            raise ValueError("ideal_cached_tokens: sent_ns and ready_ns need one entry per request")
        events = []
        for i in range(n):
            s, r = sent_ns[i], ready_ns[i]
            if s is not None:
                events.append((s, 1, i))  # at equal times a prefill done counts first
                if r is not None:
                    events.append((r, 0, i))
        events.sort(key=lambda e: (e[0], e[1]))
    cache: OrderedDict[int, int] = OrderedDict()  # chain key -> block tokens; oldest first
    held = 0
    out = [0] * n
    chains: dict[int, tuple[list[int], list[int]]] = {}

    def chain(i: int) -> tuple[list[int], list[int]]:
        if i not in chains:
            r = trace.requests[i]
            sizes = trace.block_sizes(r)
            keys, h = [], 0
            for bid, size in zip(r.hash_ids, sizes, strict=True):
                h = hash((h, bid, size))
                keys.append(h)
            chains[i] = (keys, sizes)
        return chains[i]

    timed = sent_ns is not None
    for _, kind, i in events:
        keys, sizes = chain(i)
        if kind == (1 if timed else 0):  # arrival: the longest cached run of leading blocks
            hit = 0
            for key, size in zip(keys, sizes, strict=True):
                if key not in cache:
                    break
                hit += size
                cache.move_to_end(key)
            out[i] = min(hit, trace.requests[i].input_length - 1)
            continue
        for key, size in zip(reversed(keys), reversed(sizes), strict=True):  # parents end up most recent
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = size
                held += size
        if cache_tokens is not None:
            while held > cache_tokens and cache:
                _, size = cache.popitem(last=False)
                held -= size
    return out


def ideal_hit_ratio(trace: Trace, cache_tokens: int | None = None) -> float:
    """Cached tokens over prompt tokens, over the whole trace, with an ideal cache of `cache_tokens`."""
    total = sum(r.input_length for r in trace.requests)
    return sum(ideal_cached_tokens(trace, cache_tokens)) / total if total else 0.0
