"""Ground truth: one JSON line per generation request, saying exactly what the emulator wrote and when.

Line fields:
- `id`: the client's `X-Request-Id` header when present, else the response id; `response_id`; `endpoint`; `stream`
- `recv_ns`: `time.monotonic_ns()` when the request was complete; `headers_ns`: when the response headers were written
- `chunks`: `[[write_ns, tokens], ...]`, one per token-bearing SSE event (a chat chunk that carries both reasoning and
  content is two events, two entries), or one entry for a whole non-stream body; `write_ns` is taken just before
  `transport.write`, so a client on the same host never receives a chunk before its `write_ns`
- `end_ns`: when the last byte was written (or the connection dropped)
- `status`, `prompt_tokens`, `completion_tokens`, `cached_tokens`, `finish_reason`, `fault` (or null)
- `sched_ns`: the engine's scheduled emission time of each entry of `chunks`, when known (lateness = write - sched)

Requests answered before reaching the engine (an injected 429/500/503, a context-length 400) get a line too, with
no chunks. Lines are buffered and flushed at least every second and at exit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class GroundTruthWriter:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the server's lifetime
        self._buf: list[str] = []

    def add(self, record: dict) -> None:
        self._buf.append(json.dumps(record, separators=(",", ":")))

    def flush(self) -> None:
        if self._buf:
            self._f.write("\n".join(self._buf) + "\n")
            self._buf.clear()
            self._f.flush()

    def close(self) -> None:
        self.flush()
        self._f.close()


def read_ground_truth(path: str | os.PathLike) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
