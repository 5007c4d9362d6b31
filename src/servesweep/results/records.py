"""Per-request records: one row per request, the raw material of every metric (see docs/metrics.md).

Times are `time.monotonic_ns()` of the process that made the request (the emulator's ground truth uses the same
clock). `mono_to_wall_ns` turns any of them into Unix-epoch nanoseconds for that process: wall = mono + offset.
No Locust import here: the orchestrator reads these files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from servesweep.files import atomic_path


class _PandasHidden:
    """A meta-path finder that makes `import pandas` fail, for one call (see _arrow_without_pandas)."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name == "pandas":
            raise ImportError("hidden from pyarrow's one-time check (servesweep.results.records)")
        return None


def _arrow_without_pandas() -> None:
    """pyarrow asks once per process, at its first conversion of Python objects, whether pandas is importable,
    and imports it when it is (0.4-0.9 s of CPU on the test machine, in every Locust process and CLI command that
    builds a table; servesweep never uses pandas). That first conversion is made here with pandas hidden, so
    pyarrow records "no pandas" for its own conversions; `import pandas` by anyone later works as usual, and so
    does `Table.to_pandas()` (it imports pandas itself). Where pandas is already imported nothing changes."""
    import sys

    if "pandas" in sys.modules:
        return
    sys.meta_path.insert(0, _PandasHidden)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_PandasHidden)


_arrow_without_pandas()

SCHEMA_VERSION = 1

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

_FIELDS: list[pa.Field] = (
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
        pa.field("first_reasoning_ns", pa.int64()),  # first chunk carrying reasoning_content
        pa.field("first_answer_ns", pa.int64()),  # first chunk carrying content (or text, tool calls)
        pa.field("session_id", pa.string()),  # agent and trace sessions: the session this turn belongs to
        pa.field("turn", pa.int32()),  # agent and trace sessions: 0-based turn within the session
        pa.field("workload", pa.string()),  # what made the request: synthetic, shared_prefix, dataset, agent, trace
        pa.field("rx_clock", pa.string()),  # arrival stamps: 'kernel' (SO_TIMESTAMPNS) or 'user'
        pa.field("read_lag_ns", pa.int64()),  # max over reads of (read time − kernel arrival)
        pa.field("response_text", pa.string()),  # the answer as streamed (content; a completion's text)
        pa.field("reasoning_text", pa.string()),  # reasoning_content, kept apart from the answer
        # n > 1 (client/stream_choices.py): chunk_ns and chunk_tokens are the lead choice's (its token came first)
        pa.field("choices", pa.int32()),  # choices the stream carried (1 for n = 1); null without a token
        pa.field("lead_choice", pa.int32()),  # n > 1: the index of the choice chunk_ns holds
        pa.field("choice_completion_tokens", pa.list_(pa.int32())),  # n > 1: per choice, when the server said
        pa.field("trace_index", pa.int32()),  # a trace replay: the request's index in the replayed window
        # a trace replay's start (a request, a session's first turn) that found every user busy at its slot: the
        # concurrency cap held it back (sent late, its lag in scheduled_ns)
        pa.field("cap_bound", pa.bool_()),
    ]
)
SCHEMA = pa.schema(_FIELDS)
COLUMNS = tuple(SCHEMA.names)
# columns a records file written before they existed may lack: read as nulls
LATER_COLUMNS = ("choices", "lead_choice", "choice_completion_tokens", "trace_index", "cap_bound")


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
    meta[b"servesweep.results.records.version"] = str(SCHEMA_VERSION).encode()
    for k, v in (metadata or {}).items():
        meta[f"servesweep.{k}".encode()] = str(v).encode()
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_parquet(path: Path) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"records file {path} does not exist")
    t = pq.read_table(path)
    for name in LATER_COLUMNS:
        if name not in t.schema.names:
            t = t.append_column(SCHEMA.field(name), pa.nulls(t.num_rows, SCHEMA.field(name).type))
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

    def columns_since(self, n: int) -> tuple[dict[str, list], int]:
        """The rows added since the buffer held `n` rows, as columns, and the count to pass next time.

        For readers that follow a local runner's buffer (the web UI, the exporter) without touching its lists; after
        a `take()` the buffer is shorter than `n`, and reading starts again from its first row.
        """
        total = len(self)
        start = n if 0 <= n <= total else 0
        return {k: v[start:total] for k, v in self._cols.items()}, total

    def rows_since(self, n: int) -> tuple[list[dict], int]:
        """`columns_since` as one dict per row (what the web UI and the exporter fold in one by one)."""
        cols, total = self.columns_since(n)
        names = list(cols)
        return [dict(zip(names, r, strict=True)) for r in zip(*cols.values(), strict=True)], total

    def take(self) -> dict[str, list]:
        out, self._cols = self._cols, {n: [] for n in COLUMNS}
        return out

    def table(self) -> pa.Table:
        return columns_to_table(self._cols)
