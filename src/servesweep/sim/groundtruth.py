"""Ground truth: one JSON line per finished request, saying exactly what the emulator wrote and when.

Line fields:
- `id`: the client's `X-Request-Id` header when present, else the response id; `response_id`; `endpoint`
- `recv_ns`: `time.monotonic_ns()` when the request was complete; `headers_ns`: when the response headers were written
- `chunks`: `[[write_ns, tokens], ...]`, one per token-bearing SSE event (or one for a whole non-stream body),
  `write_ns` taken right at `transport.write`
- `end_ns`: when the last byte was written (or the connection dropped)
- `status`, `prompt_tokens`, `completion_tokens`, `cached_tokens`, `finish_reason`, `fault` (or null)
- `sched_ns`: the engine's scheduled emission time of each token chunk (same order as `chunks`) when known

Lines are buffered and flushed at least every second and at exit.
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
