"""Small generated traces in every format, with sharing known in advance (tests and examples; no network).

`shared_prefix_requests` makes requests in `groups` groups: every request of a group starts with the group's
`prefix_blocks` full blocks, then blocks of its own and a partial last block. Under an unlimited cache, every
request but each group's first is served its group's prefix, so the ideal hit ratio is known in closed form
(`expected_hit_ratio`). The writers put the same requests in each public format; `session_requests` makes
agentic sessions whose turns grow by whole blocks.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesweep.workload.trace.model import Trace, TraceRequest


@dataclass
class Synth:
    """A generated trace and what it should show: the ideal cached tokens under an unlimited cache."""

    trace: Trace
    expected_cached: int
    prompt_tokens: int

    @property
    def expected_hit_ratio(self) -> float:
        return self.expected_cached / self.prompt_tokens


def shared_prefix_requests(
    n: int = 40,
    *,
    groups: int = 4,
    prefix_blocks: int = 2,
    own_blocks: int = 1,
    block_size: int = 512,
    rate_rps: float = 10.0,
    output_length: int = 8,
    seed: int = 0,
) -> Synth:
    """n requests at `rate_rps` (evenly spaced); request i is in group i % groups. Ids: group g's prefix blocks
    are g * 1000 + k, every other block's id is unique."""
    rng = random.Random(seed)
    reqs, cached, total = [], 0, 0
    nxt = 10**6
    seen: set[int] = set()
    for i in range(n):
        g = i % groups
        tail = rng.randint(1, block_size - 1)  # the partial last block
        length = (prefix_blocks + own_blocks) * block_size + tail
        own = list(range(nxt, nxt + own_blocks + 1))
        nxt += own_blocks + 1
        ids = [g * 1000 + k for k in range(prefix_blocks)] + own
        reqs.append(
            TraceRequest(timestamp_ms=round(i * 1000.0 / rate_rps, 3), input_length=length, output_length=output_length, hash_ids=ids)
        )
        if g in seen:
            cached += prefix_blocks * block_size
        seen.add(g)
        total += length
    return Synth(Trace(block_size=block_size, source="synth:shared_prefix", requests=reqs), cached, total)


def session_requests(
    sessions: int = 3,
    turns: int = 3,
    *,
    first_blocks: int = 2,
    grow_blocks: int = 1,
    block_size: int = 512,
    delay_ms: float = 50.0,
    gap_ms: float = 100.0,
    output_length: int = 8,
) -> Synth:
    """`sessions` sessions of `turns` turns; turn 0 is `first_blocks` blocks and a partial one, turn k+1 repeats
    turn k's full blocks and adds `grow_blocks` of its own (plus a partial one). Ids are left to the reader (the
    sessions format gives a turn its previous turn's full blocks)."""
    reqs, cached, total = [], 0, 0
    for s in range(sessions):
        prev_full = 0
        for k in range(turns):
            full = first_blocks + k * grow_blocks
            length = full * block_size + min(100, block_size // 2) + k  # a partial last block
            reqs.append(
                TraceRequest(
                    timestamp_ms=s * gap_ms + k * delay_ms,
                    input_length=length,
                    output_length=output_length,
                    hash_ids=[],  # filled by the reader; not a valid Trace until then
                    session_id=f"s{s}",
                    turn=k,
                    delay_ms=delay_ms if k else None,
                )
            )
            cached += prev_full * block_size
            total += length
            prev_full = full
    return Synth(Trace.model_construct(block_size=block_size, source="synth:sessions", requests=reqs), cached, total)


# ------------------------------------------------------------------------------------- writers, one per format


def write_mooncake(path: Path, trace: Trace) -> Path:
    lines = [
        json.dumps({"timestamp": int(r.timestamp_ms), "input_length": r.input_length, "output_length": r.output_length, "hash_ids": r.hash_ids})
        for r in trace.requests
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_azure(path: Path, trace: Trace, start: str = "2023-11-16 18:15:46") -> Path:
    t0 = dt.datetime.fromisoformat(start)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for r in trace.requests:
            t = t0 + dt.timedelta(milliseconds=r.timestamp_ms)
            w.writerow([t.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", r.input_length, r.output_length])
    return path


def write_bailian(path: Path, trace: Trace, *, as_csv: bool = False) -> Path:
    """Bailian's fields: timestamp in seconds; sessions as chat_id/parent_chat_id chains, turns from 1."""
    rows = []
    last: dict[str, int] = {}
    for i, r in enumerate(trace.requests):
        parent = last.get(r.session_id, -1) if r.session_id else -1
        if r.session_id:
            last[r.session_id] = i
        rows.append(
            {
                "chat_id": i,
                "parent_chat_id": parent,
                "timestamp": round(r.timestamp_ms / 1000.0, 6),
                "input_length": r.input_length,
                "output_length": r.output_length,
                "type": "text",
                "turn": (r.turn or 0) + 1,
                "hash_ids": r.hash_ids,
            }
        )
    if not as_csv:
        path.write_text("".join(json.dumps(x) + "\n" for x in rows))
        return path
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["timestamp"])
        w.writeheader()
        for x in rows:
            w.writerow({**x, "hash_ids": json.dumps(x["hash_ids"])})
    return path


def write_sessions(path: Path, trace: Trace) -> Path:
    """The agentic session format: one turn per line; a turn's delay after its previous turn ends."""
    lines = []
    for r in trace.requests:
        obj: dict[str, Any] = {"session_id": r.session_id, "turn": r.turn, "input_length": r.input_length, "output_length": r.output_length}
        if r.turn == 0:
            obj["timestamp_ms"] = r.timestamp_ms
        if r.delay_ms is not None:
            obj["delay_ms"] = r.delay_ms
        if r.hash_ids:
            obj["hash_ids"] = r.hash_ids
        lines.append(json.dumps(obj))
    path.write_text("\n".join(lines) + "\n")
    return path
