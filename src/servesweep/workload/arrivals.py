"""Open-loop arrival schedules: when each request of a constant-rate or Poisson point is due.

A schedule is deterministic: the same (kind, rate, seed, worker index, worker count) gives the same slots, so a
point can be re-run with the same arrivals. The rate is split across the worker processes of a point: worker i of
N runs at rate/N.

- constant: worker i's k-th slot is at (i + k*N) / rate seconds from its start, so N workers started together
  interleave into one evenly spaced stream at `rate`;
- poisson: each worker draws exponential gaps of mean N/rate from its own random stream (seeded by the point's seed
  and its index). The superposition of N independent Poisson processes of rate r/N is a Poisson process of rate r.

No Locust or gevent import: the users sleep until a slot themselves.
"""

from __future__ import annotations

import math
import random
import time
from typing import Literal

Arrival = Literal["closed", "constant", "poisson"]


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
