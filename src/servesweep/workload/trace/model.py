"""The one internal trace model and its native file format.

A trace is requests in arrival order. Each request says when it arrives (`timestamp_ms` from the trace's start),
how long its prompt is (`input_length`, as the server counts it: chat template included), how many tokens it asks
for (`output_length`) and what its prompt is made of: `hash_ids`, one id per block of `block_size` tokens (the last
block holds the remainder). Two requests whose `hash_ids` start the same share those leading blocks token for
token; an id never stands for two different texts. Readers of traces that carry no block ids give every block an id
of its own (no sharing), so `hash_ids` is always there and always `ceil(input_length / block_size)` long.

Multi-turn sessions: requests with a `session_id` and a `turn` (0-based); a later turn is sent `delay_ms` after the
previous turn of its session has finished, so its `timestamp_ms` is only an estimate (the previous turn's
timestamp plus its delay, service time left out) used for ordering and statistics.

Native format (JSONL, `*.trace.jsonl` by convention): a header line, then one request per line:

    {"servesweep_trace": 1, "block_size": 512, "source": "mooncake:conversation_trace.jsonl"}
    {"timestamp_ms": 0.0, "input_length": 1030, "output_length": 64, "hash_ids": [0, 1, 2]}
    {"timestamp_ms": 12.5, "input_length": 700, "output_length": 16, "hash_ids": [0, 7], "session_id": "s1", "turn": 0}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

NATIVE_VERSION = 1
DEFAULT_BLOCK_SIZE = 512  # Mooncake/FAST'25's block; Bailian's traces use 16


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file, the line and the field."""


class TraceRequest(BaseModel):
    """One request of a trace."""

    model_config = ConfigDict(extra="forbid")

    timestamp_ms: float = Field(ge=0)
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=0)
    hash_ids: list[int]
    session_id: str | None = None
    turn: int | None = Field(default=None, ge=0)
    delay_ms: float | None = Field(default=None, ge=0)  # after the previous turn of the session finished
    kind: str | None = None  # the trace's request type (Bailian: text/search/image/file), kept for statistics

    @model_validator(mode="after")
    def _session_fields(self) -> TraceRequest:
        if (self.turn is not None or self.delay_ms is not None) and self.session_id is None:
            raise ValueError("turn and delay_ms belong to a session: give session_id too")
        return self


class Trace(BaseModel):
    """Requests in arrival order, with the block size their `hash_ids` count in."""

    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(default=DEFAULT_BLOCK_SIZE, ge=1)
    source: str | None = None
    requests: list[TraceRequest] = Field(default_factory=list)

    @model_validator(mode="after")
    def _blocks(self) -> Trace:
        for i, r in enumerate(self.requests):
            check_blocks(r, self.block_size, f"request {i}: hash_ids")
        return self

    def block_sizes(self, r: TraceRequest) -> list[int]:
        """Tokens of each of the request's blocks: `block_size` each, the last one the remainder."""
        return block_sizes(r.input_length, self.block_size)

    def duration_ms(self) -> float:
        return max((r.timestamp_ms for r in self.requests), default=0.0)

    def sessions(self) -> dict[str, list[int]]:
        """Request indices of each session, in turn order."""
        out: dict[str, list[int]] = {}
        for i, r in enumerate(self.requests):
            if r.session_id is not None:
                out.setdefault(r.session_id, []).append(i)
        for idx in out.values():
            idx.sort(key=lambda i: (self.requests[i].turn or 0, i))
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write the native JSONL format (a header line, then one request per line)."""
        from servesweep.files import write_atomic

        lines = [json.dumps({"servesweep_trace": NATIVE_VERSION, "block_size": self.block_size, "source": self.source})]
        lines += [r.model_dump_json(exclude_none=True) for r in self.requests]
        write_atomic(Path(path), ("\n".join(lines) + "\n").encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Trace:
        """Read the native JSONL format; a TraceError naming file:line and the field on bad input."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise TraceError(f"{p}: cannot read the trace ({e.strerror or e})") from None
        header: dict[str, Any] | None = None
        requests: list[TraceRequest] = []
        block_size = DEFAULT_BLOCK_SIZE
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            obj = parse_json_line(p, n, line)
            if header is None:
                if obj.get("servesweep_trace") != NATIVE_VERSION:
                    raise TraceError(
                        f"{p}:{n}: not a servesweep trace (its first line must be the header "
                        f'{{"servesweep_trace": {NATIVE_VERSION}, "block_size": ...}}); convert other formats with '
                        f"`servesweep trace convert`"
                    )
                header = obj
                bs = obj.get("block_size", DEFAULT_BLOCK_SIZE)
                if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
                    raise TraceError(f"{p}:{n}: block_size={bs!r}: expected an integer ≥ 1")
                block_size = bs
                continue
            requests.append(make_request(p, n, obj, block_size))
        if header is None:
            raise TraceError(f"{p}: empty file, not a servesweep trace")
        return cls(block_size=block_size, source=header.get("source"), requests=requests)


def block_sizes(input_length: int, block_size: int) -> list[int]:
    full, rest = divmod(input_length, block_size)
    return [block_size] * full + ([rest] if rest else [])


def check_blocks(r: TraceRequest, block_size: int, where: str) -> None:
    """A ValueError, `where` first, when the request's hash_ids do not cover its input in blocks of block_size."""
    want = -(-r.input_length // block_size)
    if len(r.hash_ids) != want:
        raise ValueError(
            f"{where}: {len(r.hash_ids)} ids, but input_length={r.input_length} in blocks of {block_size} tokens "
            f"takes {want} (is the block size right? --block-size)"
        )


def parse_json_line(path: Path, n: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise TraceError(f"{path}:{n}: not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
    return obj


def make_request(path: Path, n: int, fields: dict[str, Any], block_size: int) -> TraceRequest:
    """A TraceRequest from one line's fields; a TraceError naming file:line and the first bad field."""
    try:
        r = TraceRequest(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "line"
        got = f" (got {err['input']!r})" if loc != "line" and "input" in err else ""
        raise TraceError(f"{path}:{n}: {loc}: {err['msg']}{got}") from None
    except TypeError as e:
        raise TraceError(f"{path}:{n}: {e}") from None
    try:
        check_blocks(r, block_size, "hash_ids")
    except ValueError as e:
        raise TraceError(f"{path}:{n}: {e}") from None
    return r
