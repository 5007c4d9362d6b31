"""Readers of the public trace formats, each into the one `Trace` model (`servesweep.workload.trace.model`).

| format | file | fields read |
|---|---|---|
| `native` | servesweep JSONL (header line first) | see `model` |
| `mooncake` | Mooncake/FAST'25 JSONL | `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (512-token blocks; optional) |
| `azure` | Azure LLM inference CSV (2023/2024) | `TIMESTAMP` (date and time), `ContextTokens`, `GeneratedTokens` |
| `bailian` | Alibaba Qwen-Bailian JSONL or CSV | `timestamp` (s), `input_length`, `output_length`, `hash_ids` (16-token blocks; optional), `chat_id`, `parent_chat_id`, `turn`, `type` |
| `sessions` | agentic session JSONL | `session_id`, `turn`, `input_length`, `output_length`, `delay_ms`, `timestamp_ms`, `hash_ids` (optional) |

Traces without block ids (Azure; Mooncake or Bailian lines without `hash_ids`; sessions without them) get ids of
their own per block, so they share nothing, except a session's turn, which starts with its previous turn's full
blocks (an agent's next prompt holds the conversation so far). Timestamps that are absolute times (the first one a
day or more after 0: guidellm's trace files, in Unix seconds) are re-timed from the first request.

Peers' own replay formats are these: SGLang's `bench_serving --dataset-name mooncake` and vLLM's `bench serve
--dataset-name timed-trace` (vLLM PR 39795) read the Mooncake JSONL itself (vLLM also Bailian's, `hash_ids`
optional), AIPerf's `mooncake_trace` is Mooncake JSONL with optional `hash_ids`, and guidellm's trace replay reads
JSONL of `timestamp` (s), `input_length`, `output_length` (read it `--from bailian`). A Bailian session is a root request and the requests whose `parent_chat_id` chain leads
to it. Every error names file:line and the field.
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servesweep.workload.trace.model import (
    DEFAULT_BLOCK_SIZE,
    Trace,
    TraceError,
    TraceRequest,
    make_request,
    parse_json_line,
)

FORMATS = ("auto", "native", "mooncake", "azure", "bailian", "sessions")
BAILIAN_BLOCK_SIZE = 16


# a first timestamp this late (a day) is an absolute time: the trace is re-timed from its first request
ABSOLUTE_AFTER_MS = 86_400_000.0


def read_trace(path: str | Path, fmt: str = "auto", *, block_size: int | None = None) -> Trace:
    """The trace in `path`, read as `fmt` ("auto": from the file's first line). `block_size` overrides the format's
    own (Mooncake 512, Bailian 16; elsewhere the block size ids are made in, default 512)."""
    p = Path(path)
    if fmt not in FORMATS:
        raise TraceError(f"trace format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if block_size is not None and (isinstance(block_size, bool) or block_size < 1):
        raise TraceError(f"block_size={block_size!r}: expected an integer ≥ 1")
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt == "native":
        t = Trace.load(p)
        if block_size is not None and block_size != t.block_size:
            raise TraceError(f"{p}: a native trace keeps its own block size ({t.block_size}), not {block_size}")
        return t
    reader = {"mooncake": _mooncake, "azure": _azure, "bailian": _bailian, "sessions": _sessions}[fmt]
    bs = block_size or (BAILIAN_BLOCK_SIZE if fmt == "bailian" else DEFAULT_BLOCK_SIZE)
    reqs = reader(p, bs)
    reqs.sort(key=lambda r: r.timestamp_ms)  # stable: equal timestamps keep the file's order
    if reqs and reqs[0].timestamp_ms >= ABSOLUTE_AFTER_MS:
        # absolute times (guidellm's traces: Unix seconds): the trace starts at its first request, as a replay does
        t0 = reqs[0].timestamp_ms
        reqs = [r.model_copy(update={"timestamp_ms": r.timestamp_ms - t0}) for r in reqs]
    return Trace(block_size=bs, source=f"{fmt}:{p.name}", requests=reqs)


def detect_format(p: Path) -> str:
    """The format of a trace file, from its first line (a CSV header, or the first JSON object's keys)."""
    with p.open(encoding="utf-8", errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    if not first:
        raise TraceError(f"{p}: empty file")
    if not first.lstrip().startswith("{"):
        cols = {c.strip().strip('"') for c in first.split(",")}
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
            return "azure"
        if {"timestamp", "input_length", "output_length"} <= cols:
            return "bailian"
        raise TraceError(
            f"{p}:1: a CSV header with neither Azure's columns (TIMESTAMP, ContextTokens, GeneratedTokens) nor "
            f"Bailian's (timestamp, input_length, output_length, ...); name the format with --from"
        )
    keys = set(parse_json_line(p, 1, first))
    if "servesweep_trace" in keys:
        return "native"
    if "chat_id" in keys:
        return "bailian"
    if "session_id" in keys:
        return "sessions"
    if {"timestamp", "input_length", "output_length"} <= keys:
        return "mooncake"
    raise TraceError(
        f"{p}:1: cannot tell the trace format from the keys {sorted(keys)}; name it with --from "
        f"({', '.join(FORMATS[1:])})"
    )


# ---------------------------------------------------------------------------------------------------- helpers


def _json_lines(p: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                yield n, parse_json_line(p, n, line)


def _need(p: Path, n: int, obj: dict[str, Any], key: str) -> Any:
    if key not in obj or obj[key] is None or obj[key] == "":
        raise TraceError(f"{p}:{n}: {key}: missing (this format needs it on every line)")
    return obj[key]


def _number(p: Path, n: int, obj: dict[str, Any], key: str) -> float:
    v = _need(p, n, obj, key)
    try:
        if isinstance(v, bool):
            raise ValueError
        return float(v)
    except (TypeError, ValueError):
        raise TraceError(f"{p}:{n}: {key}: expected a number, got {v!r}") from None


def _int(p: Path, n: int, obj: dict[str, Any], key: str) -> int:
    x = _number(p, n, obj, key)
    if x != int(x):
        raise TraceError(f"{p}:{n}: {key}: expected a whole number of tokens, got {obj[key]!r}")
    return int(x)


def _ids(p: Path, n: int, v: Any) -> list[int]:
    """hash_ids as a JSON list (JSONL), or a CSV cell holding a JSON list or ids split by spaces."""
    if isinstance(v, str):
        s = v.strip()
        try:
            v = json.loads(s) if s.startswith("[") else [int(x) for x in s.replace(",", " ").split()]
        except ValueError:
            raise TraceError(f"{p}:{n}: hash_ids: expected a list of integers, got {s[:60]!r}") from None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise TraceError(f"{p}:{n}: hash_ids: expected a list of integers, got {str(v)[:60]}")
    return v


class _FreshIds:
    """Block ids for blocks a trace gives none: above every id the trace uses, so nothing is shared by accident."""

    def __init__(self, start: int = 1 << 40):
        self._c = itertools.count(start)

    def take(self, k: int) -> list[int]:
        return [next(self._c) for _ in range(k)]


def _blocks(length: int, bs: int) -> int:
    return -(-length // bs)


# ---------------------------------------------------------------------------------------------------- formats


def _ids_or_fresh(p: Path, n: int, obj: dict[str, Any], inp: int, bs: int, fresh: _FreshIds) -> list[int]:
    """A line's hash_ids, or (a trace that gives none: AIPerf's and vLLM's timed-trace make them optional, guidellm's
    trace_synthetic has none) ids of its own per block: nothing shared."""
    if obj.get("hash_ids") in (None, ""):
        return fresh.take(_blocks(max(inp, 1), bs))
    return _ids(p, n, obj["hash_ids"])


def _mooncake(p: Path, bs: int) -> list[TraceRequest]:
    out = []
    fresh = _FreshIds()
    for n, obj in _json_lines(p):
        inp = _int(p, n, obj, "input_length")
        fields = {
            "timestamp_ms": _number(p, n, obj, "timestamp"),
            "input_length": inp,
            "output_length": _int(p, n, obj, "output_length"),
            "hash_ids": _ids_or_fresh(p, n, obj, inp, bs, fresh),
        }
        out.append(make_request(p, n, fields, bs))
    return out


def _azure_time(p: Path, n: int, v: str) -> float:
    """Azure's TIMESTAMP ('2023-11-16 18:15:46.6805900', 7 fractional digits) in ms since the epoch."""
    s = v.strip()
    head, dot, frac = s.partition(".")
    try:
        t = dt.datetime.fromisoformat(head + (dot + frac[:6] if dot else ""))
    except ValueError:
        raise TraceError(f"{p}:{n}: TIMESTAMP: expected a date and time, got {v!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp() * 1000.0


def _csv_rows(p: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with p.open(encoding="utf-8", newline="") as f:
        r = csv.DictReader(f)
        r.fieldnames = [c.strip() for c in (r.fieldnames or [])]
        for row in r:
            yield r.line_num, row


def _azure(p: Path, bs: int) -> list[TraceRequest]:
    fresh = _FreshIds(0)
    rows = []
    for n, row in _csv_rows(p):
        t = _azure_time(p, n, str(_need(p, n, row, "TIMESTAMP")))
        rows.append((n, t, _int(p, n, row, "ContextTokens"), _int(p, n, row, "GeneratedTokens")))
    t0 = min((t for _, t, _, _ in rows), default=0.0)
    out = []
    for n, t, inp, outp in rows:
        fields = {"timestamp_ms": t - t0, "input_length": inp, "output_length": outp}
        if inp < 1:
            raise TraceError(f"{p}:{n}: ContextTokens: expected ≥ 1, got {inp}")
        out.append(make_request(p, n, {**fields, "hash_ids": fresh.take(_blocks(inp, bs))}, bs))
    return out


def _bailian(p: Path, bs: int) -> list[TraceRequest]:
    first = next((line for line in p.open(encoding="utf-8") if line.strip()), "")
    rows = _json_lines(p) if first.lstrip().startswith("{") else _csv_rows(p)
    raw = []
    fresh = _FreshIds()
    for n, obj in rows:
        chat = obj.get("chat_id")
        parent = obj.get("parent_chat_id", -1)
        try:
            chat = None if chat in (None, "") else int(chat)
            parent = -1 if parent in (None, "") else int(parent)
        except (TypeError, ValueError):
            raise TraceError(f"{p}:{n}: chat_id/parent_chat_id: expected integers") from None
        inp = _int(p, n, obj, "input_length")
        fields = {
            "timestamp_ms": _number(p, n, obj, "timestamp") * 1000.0,
            "input_length": inp,
            "output_length": _int(p, n, obj, "output_length"),
            "hash_ids": _ids_or_fresh(p, n, obj, inp, bs, fresh),
        }
        if obj.get("type") not in (None, ""):
            fields["kind"] = str(obj["type"])
        raw.append((n, chat, parent, obj.get("turn"), fields))
    parents = {chat: parent for _, chat, parent, _, _ in raw if chat is not None}
    children = {parent for _, _, parent, _, _ in raw if parent != -1}

    def root(c: int) -> int:
        seen = set()
        while parents.get(c, -1) != -1 and c not in seen:
            seen.add(c)
            c = parents[c]
        return c

    out = []
    for n, chat, parent, turn, fields in raw:
        # a session: a request with a parent, or a root that has children; a lone request stays sessionless
        if chat is not None and (parent != -1 or chat in children):
            fields["session_id"] = str(root(chat))
            if turn not in (None, ""):
                try:
                    fields["turn"] = max(0, int(turn) - 1)  # Bailian counts turns from 1
                except (TypeError, ValueError):
                    raise TraceError(f"{p}:{n}: turn: expected an integer, got {turn!r}") from None
        out.append(make_request(p, n, fields, bs))
    return out


_SESSION_KEYS = {
    "session_id", "turn", "input_length", "output_length", "delay_ms", "timestamp_ms", "hash_ids",
    "tool_result_tokens", "kind",
}  # fmt: skip


def _sessions(p: Path, bs: int) -> list[TraceRequest]:
    rows = []
    for n, obj in _json_lines(p):
        extra = set(obj) - _SESSION_KEYS
        if extra:
            raise TraceError(f"{p}:{n}: {sorted(extra)[0]}: not a field of the session format ({sorted(_SESSION_KEYS)})")
        sid = _need(p, n, obj, "session_id")
        turn = _int(p, n, obj, "turn")
        if turn < 0:
            raise TraceError(f"{p}:{n}: turn: expected ≥ 0, got {turn}")
        rows.append((str(sid), turn, n, obj))
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    fresh = _FreshIds()
    out = []
    for sid, group in itertools.groupby(rows, key=lambda x: x[0]):
        prev: TraceRequest | None = None
        for _, turn, n, obj in group:
            if prev is not None and turn == prev.turn:
                raise TraceError(f"{p}:{n}: turn: session {sid!r} has turn {turn} twice")
            inp = _int(p, n, obj, "input_length")
            if "hash_ids" in obj:
                ids = _ids(p, n, obj["hash_ids"])
            else:
                # the conversation so far: the previous turn's full blocks, then blocks of this turn's own
                keep = 0 if prev is None else min(prev.input_length // bs, inp // bs)
                ids = (prev.hash_ids[:keep] if prev else []) + fresh.take(_blocks(inp, bs) - keep)
            delay = _number(p, n, obj, "delay_ms") if obj.get("delay_ms") is not None else None
            if prev is None:
                ts = _number(p, n, obj, "timestamp_ms") if obj.get("timestamp_ms") is not None else 0.0
            elif obj.get("timestamp_ms") is not None:
                ts = _number(p, n, obj, "timestamp_ms")
            else:  # an estimate: the previous turn's arrival plus the think time (its service time left out)
                ts = prev.timestamp_ms + (delay or 0.0)
            fields = {
                "timestamp_ms": ts,
                "input_length": inp,
                "output_length": _int(p, n, obj, "output_length"),
                "hash_ids": ids,
                "session_id": sid,
                "turn": turn,
                "delay_ms": delay,
            }
            if obj.get("kind") is not None:
                fields["kind"] = str(obj["kind"])
            prev = make_request(p, n, fields, bs)
            out.append(prev)
    return out
