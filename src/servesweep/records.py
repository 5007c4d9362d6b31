"""Per-request records: one row per request, the raw material of every metric (see docs/metrics.md).

Times are `time.monotonic_ns()` of the process that made the request (the emulator's ground truth uses the same
clock). `mono_to_wall_ns` turns any of them into Unix-epoch nanoseconds for that process: wall = mono + offset.
No Locust import here: the orchestrator reads these files.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1
_CONTEXT_400 = re.compile(r"context length|context window|maximum allowed length|maximum context", re.I)
_MSG_MAX = 300

# Error classes a request can end in; None/null means success. Kept here so the summary and docs share one list.
ERROR_CLASSES = (
    "http_400_context",  # the server's context-length 400 (message kept)
    "http_4xx",
    "http_429",
    "http_5xx",
    "timeout_connect",
    "timeout_first_token",
    "timeout_stall",
    "timeout_total",
    "connection_reset",  # connection refused/reset/closed before or during the stream
    "no_done",  # the stream ended without `data: [DONE]`
    "stream_error_event",  # an in-stream `{"error": ...}` event
    "malformed_chunk",  # a `data:` line that is not JSON
    "no_tokens",  # a complete stream that carried no token
    "client_error",  # anything else raised in the client (a bug of ours, kept visible)
)

SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),  # uuid hex, sent as X-Request-Id
        pa.field("point_id", pa.string(), nullable=False),
        pa.field("worker", pa.string(), nullable=False),  # host:pid of the Locust process
        pa.field("user", pa.int32(), nullable=False),  # user index within the worker
        pa.field("warmup", pa.bool_(), nullable=False),
        pa.field("scheduled_ns", pa.int64(), nullable=False),  # when the user decided to send
        pa.field("sent_ns", pa.int64(), nullable=False),  # just before the request was written
        pa.field("headers_ns", pa.int64()),  # response headers complete
        pa.field("first_token_ns", pa.int64()),  # first token-bearing chunk read
        pa.field("chunk_ns", pa.list_(pa.int64())),  # every token-bearing chunk, in arrival order
        pa.field(
            "chunk_tokens", pa.list_(pa.int32())
        ),  # tokens per chunk, when the server said (continuous usage)
        pa.field("end_ns", pa.int64(), nullable=False),  # the stream (or the failure) ended
        pa.field("prompt_tokens", pa.int64()),  # from usage
        pa.field("completion_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("reasoning_tokens", pa.int64()),
        pa.field("target_prompt_tokens", pa.int64(), nullable=False),
        pa.field("target_output_tokens", pa.int64(), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("http_status", pa.int32()),  # 0 when no response came
        pa.field("error_class", pa.string()),  # null on success; else one of ERROR_CLASSES
        pa.field("error_message", pa.string()),  # short
        pa.field("mono_to_wall_ns", pa.int64(), nullable=False),  # wall-clock anchor of the worker
    ]
)
COLUMNS = tuple(SCHEMA.names)


def to_table(rows: Iterable[dict]) -> pa.Table:
    """Rows (dicts keyed by COLUMNS) to an Arrow table with the documented schema."""
    rows = list(rows)
    cols = {name: [r.get(name) for r in rows] for name in COLUMNS}
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def columns_to_table(cols: dict[str, list]) -> pa.Table:
    return pa.Table.from_pydict({n: cols.get(n, []) for n in COLUMNS}, schema=SCHEMA)


def write_parquet(table: pa.Table, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(table.schema.metadata or {})
    meta[b"servesweep.records.version"] = str(SCHEMA_VERSION).encode()
    for k, v in (metadata or {}).items():
        meta[f"servesweep.{k}".encode()] = str(v).encode()
    table = table.replace_schema_metadata(meta)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_parquet(path: Path) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"records file {path} does not exist")
    t = pq.read_table(path)
    missing = [n for n in COLUMNS if n not in t.schema.names]
    if missing:
        raise ValueError(f"records file {path}: missing columns {missing}; not a servesweep records file")
    return t


class RecordBuffer:
    """Column-oriented buffer the Locust process appends to; `take()` hands a batch over (to a file or a master)."""

    def __init__(self) -> None:
        self._cols: dict[str, list] = {n: [] for n in COLUMNS}

    def __len__(self) -> int:
        return len(self._cols["request_id"])

    def add(self, row: dict) -> None:
        for n, col in self._cols.items():
            col.append(row.get(n))

    def extend_columns(self, cols: dict[str, list]) -> None:
        for n, col in self._cols.items():
            col.extend(cols.get(n, ()))

    def take(self) -> dict[str, list]:
        out, self._cols = self._cols, {n: [] for n in COLUMNS}
        return out

    def table(self) -> pa.Table:
        return columns_to_table(self._cols)


# ---------------------------------------------------------------- how a stream becomes a record


def short(msg: object) -> str:
    s = str(msg).replace("\n", " ")
    return s if len(s) <= _MSG_MAX else s[: _MSG_MAX - 1] + "…"


def error_message(body: bytes) -> str:
    try:
        d = json.loads(body)
    except ValueError:
        return body[:_MSG_MAX].decode("utf-8", "replace")
    if isinstance(d, dict):
        e = d.get("error", d)
        if isinstance(e, dict) and e.get("message"):
            return str(e["message"])
        if isinstance(e, str):
            return e
    return body[:_MSG_MAX].decode("utf-8", "replace")


def classify_status(status: int, message: str) -> str:
    if status == 400 and _CONTEXT_400.search(message):
        return "http_400_context"
    if status == 429:
        return "http_429"
    if status >= 500:
        return "http_5xx"
    return "http_4xx"


class _Malformed(Exception):
    """An event whose fields have the wrong types: the chunk is malformed, the user's task goes on."""


def _count(v) -> int | None:
    """A token count from the server, or None when it is not a plausible one (wrong type, negative, absurd)."""
    return v if type(v) is int and 0 <= v < 2**53 else None


def _token_bearing(ev: dict) -> bool:
    """True when the event carries generated text; raises _Malformed when its shape is not an OpenAI chunk's."""
    choices = ev.get("choices")
    if choices is None:
        return False
    if not isinstance(choices, list):
        raise _Malformed("choices is not a list")
    found = False
    for ch in choices:
        if not isinstance(ch, dict):
            raise _Malformed("a choice is not an object")
        d = ch.get("delta")
        if d is not None:
            if not isinstance(d, dict):
                raise _Malformed("delta is not an object")
            for key in ("content", "reasoning_content"):
                v = d.get(key)
                if v is not None and not isinstance(v, str):
                    raise _Malformed(f"delta.{key} is not a string")
                found = found or bool(v)
            tc = d.get("tool_calls")
            found = found or (isinstance(tc, list) and bool(tc))
        else:
            v = ch.get("text")
            if v is not None and not isinstance(v, str):
                raise _Malformed("text is not a string")
            found = found or bool(v)
    return found


def is_token_line(line: bytes) -> bool:
    """Used only until the first token (to switch the socket from first-token to stall timeout)."""
    if not line.startswith(b"data:"):
        return False
    payload = line[5:].strip()
    if not payload or payload == b"[DONE]":
        return False
    try:
        ev = json.loads(payload)
        return isinstance(ev, dict) and _token_bearing(ev)
    except (ValueError, RecursionError, _Malformed):
        return False


def parse_stream(lines: list[bytes], times: list[int], rec: dict) -> None:
    """Fill the record from the kept SSE lines: token chunks, usage, finish reason, and the error class if any.
    Whatever the bytes, this never raises and the record fits SCHEMA (a bad field makes a malformed chunk)."""
    chunk_ns: list[int] = []
    chunk_tokens: list[int] | None = []
    done = False
    error = None
    malformed = None
    usage: dict | None = None
    finish = None
    prev_completion = 0
    for line, t in zip(lines, times, strict=True):
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, `event:` lines
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        try:
            ev = json.loads(payload)
            if not isinstance(ev, dict):
                raise _Malformed("not a JSON object")
            if ev.get("error") is not None:
                e = ev["error"]
                error = error or short(e.get("message", e) if isinstance(e, dict) else e)
                continue
            u = ev.get("usage")
            if u is not None and not isinstance(u, dict):
                raise _Malformed("usage is not an object")
            tokens = _token_bearing(ev)
        except (ValueError, RecursionError, _Malformed) as e:
            what = payload[:120].decode("utf-8", "replace")
            malformed = malformed or short(f"{e}: {what}" if isinstance(e, _Malformed) else what)
            continue
        if u:
            usage = u
        if tokens:
            chunk_ns.append(t)
            if chunk_tokens is not None:
                c = _count(u.get("completion_tokens")) if u else None
                if c is not None and c >= prev_completion and c - prev_completion < 2**31:
                    chunk_tokens.append(c - prev_completion)
                    prev_completion = c
                else:
                    chunk_tokens = None  # the server does not say per chunk (or says nonsense)
        for ch in ev.get("choices") or ():
            if ch.get("finish_reason") is not None:
                finish = ch["finish_reason"]
    rec["chunk_ns"] = chunk_ns
    rec["chunk_tokens"] = chunk_tokens if chunk_tokens else None
    rec["first_token_ns"] = chunk_ns[0] if chunk_ns else None
    rec["finish_reason"] = (
        finish if isinstance(finish, str) else (json.dumps(finish) if finish is not None else None)
    )
    if usage:
        rec["prompt_tokens"] = _count(usage.get("prompt_tokens"))
        rec["completion_tokens"] = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        rec["cached_tokens"] = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        rt = usage.get("reasoning_tokens")
        cdet = usage.get("completion_tokens_details")
        if rt is None and isinstance(cdet, dict):
            rt = cdet.get("reasoning_tokens")
        rec["reasoning_tokens"] = _count(rt)
    if error is not None:
        rec["error_class"], rec["error_message"] = "stream_error_event", error
    elif malformed is not None:
        rec["error_class"], rec["error_message"] = "malformed_chunk", malformed
    elif finish == "abort" or isinstance(finish, dict):
        rec["error_class"], rec["error_message"] = (
            "stream_error_event",
            short(f"finish_reason {rec['finish_reason']}"),
        )
    elif finish is not None and not isinstance(finish, str):
        rec["error_class"], rec["error_message"] = (
            "malformed_chunk",
            short(f"finish_reason {rec['finish_reason']}"),
        )
    elif not done:
        rec["error_class"], rec["error_message"] = "no_done", "stream ended without data: [DONE]"
    elif not chunk_ns:
        rec["error_class"], rec["error_message"] = "no_tokens", "complete stream without a token"
