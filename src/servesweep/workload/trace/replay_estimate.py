"""What a planner needs to know of a trace replay before it runs (issue 30): how long it takes and what KV it holds.

`replay_plan(fields)` reads the point's window (LoadPoint's trace fields: the file, start, window, sample, seed, the
speed-up) and gives its figures: requests, the schedule's length at the speed-up, the mean rate, the prompt and
output lengths (mean, max), the ideal prefix-cache hit rate (unlimited cache). From a per-request time (the step
model's, which the planner has) it then estimates:

- `seconds(request_s, running_cap)`: the replay's time: its schedule, or what the server takes when it cannot keep up
  (`requests` × request_s / running requests), plus the last request's own time;
- `running(e2e_s, cap)`: the requests in flight at the trace's mean rate (Little's law: rate × E2E, at most the cap);
- `kv_tokens(running)`: the KV they hold at once: each running request's prompt less its shared (cached) part, plus
  half its answer, and the shared prefixes once (an upper bound: the ideal hit rate's share of the mean prompt).

No server, no Locust: the planner (matrix/planner.py) and `servesweep plan` call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplayPlan:
    requests: int
    duration_s: float  # the schedule at the speed-up: first to last arrival
    rate_rps: float  # mean arrivals per second at the speed-up
    prompt_mean: float
    prompt_max: int
    output_mean: float
    output_max: int
    ideal_hit_ratio: float  # unlimited cache, in the trace's order
    speed_up: float
    sessions: int

    def seconds(self, request_s: float, running_cap: int) -> float:
        """The replay's time: its schedule, or the server's pace when slower (requests × request_s over the
        requests it runs at once), then the last request's own time."""
        pace = self.requests * request_s / max(1, running_cap)
        return max(self.duration_s, pace) + request_s

    def running(self, e2e_s: float, cap: int) -> float:
        """Requests in flight at the mean rate (Little's law), at most `cap` (the concurrency, the running limit)."""
        return min(float(cap), self.rate_rps * e2e_s) if self.rate_rps > 0 else 1.0

    def kv_tokens(self, running: float) -> int:
        """KV tokens `running` requests hold at once: their own prompt part and half an answer each, the shared
        prefix (the ideal hit rate's share of a mean prompt) once."""
        shared = self.ideal_hit_ratio * self.prompt_mean
        own = self.prompt_mean - shared + self.output_mean / 2
        return math.ceil(max(1.0, running) * own + shared)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def replay_plan(fields: dict[str, Any]) -> ReplayPlan:
    """The figures of a trace point's window: `fields` are LoadPoint's (trace, trace_start_s, trace_window_s,
    trace_sample, seed, trace_speedup), as an experiment's workload gives them."""
    from servesweep.workload.trace.cache import ideal_hit_ratio
    from servesweep.workload.trace.readers import read_trace
    from servesweep.workload.trace.window import window

    t = read_trace(fields["trace"])
    t = window(
        t,
        float(fields.get("trace_start_s") or 0.0),
        fields.get("trace_window_s"),
        float(fields.get("trace_sample") or 1.0),
        int(fields.get("seed") or 0),
    )
    reqs = t.requests
    speed = float(fields.get("trace_speedup") or 1.0)
    n = len(reqs)
    if not n:
        return ReplayPlan(0, 0.0, 0.0, 0.0, 0, 0.0, 0, 0.0, speed, 0)
    span_s = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000.0 / speed
    return ReplayPlan(
        requests=n,
        duration_s=span_s,
        rate_rps=(n - 1) / span_s if span_s > 0 else 0.0,
        prompt_mean=sum(r.input_length for r in reqs) / n,
        prompt_max=max(r.input_length for r in reqs),
        output_mean=sum(r.output_length for r in reqs) / n,
        output_max=max(r.output_length for r in reqs),
        ideal_hit_ratio=ideal_hit_ratio(t),
        speed_up=speed,
        sessions=len(t.sessions()),
    )
