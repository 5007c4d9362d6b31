"""Fault injection: per request with `X-Sim-Fault: kind[:arg]`, or at a seeded rate with `--sim-fault-rate`.

Kinds (what the client sees):
- `429`, `500`, `503`: that HTTP status with an SGLang/OpenAI-style error body, before any stream byte.
- `disconnect[:N]`: the server closes the socket after N token chunks (default 2) without finishing the stream.
- `error_event[:N]`: after N token chunks (default 1), an in-stream error event (500) then `data: [DONE]`.
- `stall:S`: after the first token chunk, nothing is written for S seconds; the tokens generated meanwhile
  arrive together afterwards.
- `malformed[:N]`: after N token chunks (default 1), one chunk of broken JSON, then the stream goes on.
- `slow_first_byte:S`: the response (headers included) starts S seconds late; generation starts then too.
- `loop[:N]`, `wrong_past:T`, `spec_diverge[:N]`: answer faults (ANSWER_KINDS): the stream is healthy, its text
  is not (sim/replies.py says what each writes). `--sim-answer-fault` sets one for every request of a server.

On a non-streaming request the mid-stream kinds act on its one body: `disconnect` closes the socket instead of
answering, `error_event` answers 500, `stall:S` answers S seconds late, `malformed` sends a truncated JSON body.

Server-wide faults, from a moment on (`--sim-hang-after S`, `--sim-crawl-after S:FACTOR`, seconds after the server
is ready, or `POST /sim/fault` at run time):
- hang: the server still accepts connections and reads requests but never answers anything again (`/health`
  included); streams in flight get no further byte; the process stays up (a hung GPU or collective).
- crawl: every engine step takes FACTOR times as long (a throttled or failing GPU); everything still answers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ANSWER_KINDS = ("loop", "wrong_past", "spec_diverge")
KINDS = (
    "429",
    "500",
    "503",
    "disconnect",
    "error_event",
    "stall",
    "malformed",
    "slow_first_byte",
    *ANSWER_KINDS,
)
PRE_STREAM = {"429": "Too Many Requests", "500": "Internal Server Error", "503": "Service Unavailable"}
_DEFAULT_ARG = {
    "disconnect": 2.0,
    "error_event": 1.0,
    "malformed": 1.0,
    "stall": 1.0,
    "slow_first_byte": 1.0,
    "loop": 0.0,
    "spec_diverge": 8.0,
}  # wrong_past has no default: its threshold (prompt tokens) is the point


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    arg: float = 0.0

    def __str__(self) -> str:
        return self.kind if self.kind in PRE_STREAM else f"{self.kind}:{self.arg:g}"


def parse_fault(spec: str, where: str = "X-Sim-Fault") -> Fault:
    """`stall:2.5` -> Fault("stall", 2.5). Unknown kinds and bad arguments are errors naming `where`."""
    kind, _, arg = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
    if kind in PRE_STREAM:
        if arg:
            raise ValueError(f"{where}: fault {kind!r} takes no argument")
        return Fault(kind)
    if not arg:
        if kind not in _DEFAULT_ARG:
            raise ValueError(f"{where}: fault {kind!r} needs an argument (prompt tokens), e.g. {kind}:30000")
        return Fault(kind, _DEFAULT_ARG[kind])
    try:
        val = float(arg)
    except ValueError:
        raise ValueError(f"{where}: fault {kind!r} argument {arg!r} is not a number") from None
    if val < 0:
        raise ValueError(f"{where}: fault {kind!r} argument must be ≥ 0, got {arg!r}")
    return Fault(kind, val)


def parse_fault_rates(value: str) -> dict[Fault, float]:
    """`429=0.1,stall:2=0.05` -> {Fault('429'): 0.1, Fault('stall', 2): 0.05}; the probabilities sum to ≤ 1."""
    out: dict[Fault, float] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        spec, sep, p = part.rpartition("=")
        if not sep or not spec:
            raise ValueError(f"--sim-fault-rate: {part!r} is not KIND[:ARG]=PROBABILITY")
        fault = parse_fault(spec, "--sim-fault-rate")
        try:
            prob = float(p)
        except ValueError:
            raise ValueError(f"--sim-fault-rate: probability {p!r} of {spec!r} is not a number") from None
        if not 0 <= prob <= 1:
            raise ValueError(f"--sim-fault-rate: probability of {spec!r} must be in [0, 1], got {prob}")
        out[fault] = prob
    if sum(out.values()) > 1 + 1e-9:
        raise ValueError(f"--sim-fault-rate: probabilities sum to {sum(out.values()):g} > 1")
    return out


class FaultPicker:
    """Draws at most one fault per request from the configured rates, with its own seeded generator."""

    def __init__(self, rates: dict[Fault, float], seed: int = 0):
        self._rng = random.Random(seed ^ 0x5EED)
        self._table = list(rates.items())

    def pick(self, header: str | None) -> Fault | None:
        if header:
            return parse_fault(header)
        if not self._table:
            return None
        u = self._rng.random()
        acc = 0.0
        for fault, p in self._table:
            acc += p
            if u < acc:
                return fault
        return None


def parse_crawl(value: str, where: str = "--sim-crawl-after") -> tuple[float, float]:
    """`30:10` -> (30.0, 10.0): from 30 s after ready on, every step 10 times as long. FACTOR ≥ 1."""
    after, sep, factor = value.partition(":")
    try:
        a, f = float(after), float(factor)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not SECONDS:FACTOR (e.g. 30:10)") from None
    if not sep or a < 0 or not f >= 1 or f == float("inf"):
        raise ValueError(f"{where}: {value!r}: SECONDS must be ≥ 0 and FACTOR a number ≥ 1 (e.g. 30:10)")
    return a, f
