"""Open-loop arrival schedules: when each request of a constant-rate or Poisson point is due.

A schedule is deterministic: the same (kind, rate, seed, worker index, worker count) gives the same slots, so a
point can be re-run with the same arrivals. The rate is split across the worker processes of a point: worker i of
N runs at rate/N.

- constant: worker i's k-th slot is at (i + k*N) / rate seconds from its start, so N workers started together
  interleave into one evenly spaced stream at `rate`;
- poisson: each worker draws exponential gaps of mean N/rate from its own random stream (seeded by the point's seed
  and its index). The superposition of N independent Poisson processes of rate r/N is a Poisson process of rate r.
- trace (`TraceSchedule`): a replayed trace's own timestamps (docs/workloads.md, "Trace replay"). Each slot is a
  start: one request, or a whole session, whose later turns its user sends in order, each its delay after the
  previous one ended. A session goes whole to one worker (by a stable hash of its id); requests without one go
  round-robin by their place in the trace, so N workers together send the trace's stream.

No Locust or gevent import: the users sleep until a slot themselves.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Arrival = Literal["closed", "constant", "poisson", "trace"]


class Arrivals:
    """The slots of one worker process, as absolute `time.monotonic_ns()` values from `start_ns` on (None: from
    the first call of next_ns)."""

    __slots__ = ("kind", "rate_rps", "index", "count", "start_ns", "_k", "_t", "_rng", "_period_ns")

    def __init__(
        self,
        kind: Arrival,
        rate_rps: float,
        *,
        seed: int = 0,
        index: int = 0,
        count: int = 1,
        start_ns: int | None = 0,
    ) -> None:
        if kind not in ("constant", "poisson"):
            raise ValueError(f"arrival {kind!r}: an open-loop schedule is 'constant' or 'poisson'")
        if not (rate_rps > 0 and math.isfinite(rate_rps)):
            raise ValueError(f"rate_rps must be a positive number of requests per second, got {rate_rps!r}")
        _check_worker(index, count)
        self.kind = kind
        self.rate_rps = float(rate_rps)
        self.index = index
        self.count = count
        self.start_ns = None if start_ns is None else int(start_ns)
        self._k = 0
        # Seeded by the point's seed and this worker's index: a stream of its own, the same on every re-run.
        self._rng = random.Random(f"servesweep-arrivals:{seed}:{index}:{count}")
        self._period_ns = count * 1e9 / self.rate_rps  # this worker's mean gap
        # Constant: worker i starts i/rate late so the workers interleave; Poisson: the first gap is a draw too.
        self._t = index * 1e9 / self.rate_rps if kind == "constant" else 0.0

    def next_ns(self) -> int:
        """The next slot (absolute monotonic ns); each call moves one slot on. A schedule made with start_ns=None
        starts at its first call (when the first user is ready, not while Locust is still spawning them)."""
        if self.start_ns is None:
            self.start_ns = time.monotonic_ns()
        if self.kind == "constant":
            t = self._t + self._k * self._period_ns
        else:
            self._t += self._rng.expovariate(1.0) * self._period_ns
            t = self._t
        self._k += 1
        return self.start_ns + int(t)

    def offsets_s(self, n: int) -> list[float]:
        """The next n slots in seconds from the start (for tests and previews; moves the schedule on)."""
        out = [self.next_ns() for _ in range(n)]
        start = self.start_ns
        assert start is not None  # set by the first next_ns()
        return [(t - start) / 1e9 for t in out]


def split_budget(total: int, index: int, count: int) -> int:
    """Worker `index` of `count`'s share of a request budget: the shares differ by at most one and add up to total."""
    _check_worker(index, count)
    return total // count + (1 if index < total % count else 0)


def _check_worker(index: int, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"worker index {index} of {count}: need 0 <= index < count")


@dataclass(frozen=True)
class TraceStart:
    """One slot of a trace replay: when (ns from the schedule's start) and which requests, in order (one request, or a
    session's turns; `delays_ms[k]` is turn k's wait after turn k-1 ended, None: at its own `offsets_ns[k]`)."""

    offset_ns: int
    indices: tuple[int, ...]
    delays_ms: tuple[float | None, ...]
    offsets_ns: tuple[int, ...]


def session_worker(session_id: str, count: int) -> int:
    """The worker (of `count`) that runs a session: a stable hash of its id, the same in every process."""
    return int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") % count


class TraceSchedule:
    """The slots of one worker process of a trace replay, as `TraceStart`s with absolute `time.monotonic_ns()` times
    from `start_ns` (None: from the first call of `next_start`)."""

    def __init__(
        self,
        timestamps_ms: Sequence[float],
        sessions: Sequence[str | None],
        delays_ms: Sequence[float | None] | None = None,
        turns: Sequence[int | None] | None = None,
        *,
        speed_up: float = 1.0,
        index: int = 0,
        count: int = 1,
        start_ns: int | None = 0,
    ) -> None:
        if not (speed_up > 0 and math.isfinite(speed_up)):
            raise ValueError(f"speed_up must be a positive number, got {speed_up!r}")
        if len(sessions) != len(timestamps_ms):
            raise ValueError("TraceSchedule: one session id (or None) per request")
        _check_worker(index, count)
        delays = list(delays_ms) if delays_ms is not None else [None] * len(timestamps_ms)
        order = list(turns) if turns is not None else [None] * len(timestamps_ms)
        by_session: dict[str, list[int]] = {}
        starts: list[tuple[int, list[int]]] = []
        for i, sid in enumerate(sessions):
            if sid is None:
                if i % count == index:
                    starts.append((i, [i]))
            elif sid in by_session:
                by_session[sid].append(i)
            else:
                by_session[sid] = [i]
                if session_worker(sid, count) == index:
                    starts.append((i, by_session[sid]))  # the list fills as later turns are met
        out = []
        for _, idx in starts:
            idx.sort(key=lambda i: (order[i] or 0, i))
            offs = tuple(int(timestamps_ms[i] * 1e6 / speed_up) for i in idx)
            dl = tuple(None if (d := delays[i]) is None else d / speed_up for i in idx)
            out.append(TraceStart(min(offs), tuple(idx), dl, offs))
        out.sort(key=lambda s: (s.offset_ns, s.indices[0]))
        self.starts = out
        self.speed_up = speed_up
        self.index = index
        self.count = count
        self.start_ns = None if start_ns is None else int(start_ns)
        self._k = 0

    def __len__(self) -> int:
        return len(self.starts)

    def next_start(self) -> tuple[int, TraceStart] | None:
        """(the absolute slot, the start) of the next start, or None when this worker's share is all handed out."""
        if self.start_ns is None:
            self.start_ns = time.monotonic_ns()
        if self._k >= len(self.starts):
            return None
        s = self.starts[self._k]
        self._k += 1
        return self.start_ns + s.offset_ns, s
