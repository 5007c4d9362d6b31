"""The one definition of every per-request metric: TTFT, ITL, TPOT, E2E, decode tok/s and goodput.

Each function here implements one definition of docs/metrics.md ("Latency" and "SLOs and goodput"), from the
per-request record columns of servesweep.results.records (`sent_ns`, `first_token_ns`, `chunk_ns`, `chunk_tokens`,
`end_ns`, `completion_tokens`, ...). The summary, compare, the gates, the report, the Prometheus exporter and the
web UI's live figures all call these, so a figure means the same wherever it is shown.

Two forms: functions of one request's values (for a listener that sees one record at a time) and
`request_metrics(table)`, the same definitions over a whole records table (numpy arrays, one value per row, NaN
where a request has none). No Locust import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from servesweep.config.slo import OPS

NS_PER_MS = 1e6
NS_PER_S = 1e9



# ---------------------------------------------------------------- one request


def ttft(first_token_ns, sent_ns, unit: float = NS_PER_MS):
    """TTFT: `first_token_ns − sent_ns`, in ms (or ns / `unit`) (docs/metrics.md, Latency). Scalars or arrays.
    Pass `scheduled_ns` as `sent_ns` for `ttft_from_scheduled_ms`."""
    return (first_token_ns - sent_ns) / unit


def e2e(end_ns, sent_ns, unit: float = NS_PER_MS):
    """E2E: `end_ns − sent_ns`, in ms (or ns / `unit`). Pass `scheduled_ns` for `e2e_from_scheduled_ms`."""
    return (end_ns - sent_ns) / unit


def schedule_lag(sent_ns, scheduled_ns, unit: float = NS_PER_MS):
    """Schedule lag: `sent_ns − scheduled_ns`, in ms (or ns / `unit`) (docs/metrics.md)."""
    return (sent_ns - scheduled_ns) / unit


def itl_gaps(chunk_ns: Sequence[int], unit: float = NS_PER_MS) -> np.ndarray:
    """ITL per chunk: every gap `chunk_ns[i] − chunk_ns[i−1]` of one request, in ms (or ns / `unit`)."""
    return np.diff(np.asarray(chunk_ns, dtype=np.float64)) / unit


def has_chunk_tokens(chunk_ns: Sequence[int], chunk_tokens: Sequence[int] | None) -> bool:
    """Whether the server reported tokens per chunk for this request (one count per token-bearing chunk)."""
    return chunk_tokens is not None and len(chunk_tokens) == len(chunk_ns)


def first_chunk_tokens(chunk_ns: Sequence[int], chunk_tokens: Sequence[int] | None):
    """Tokens of the first chunk: from `chunk_tokens` when reported, else 1 (docs/metrics.md, TPOT)."""
    return chunk_tokens[0] if chunk_tokens is not None and has_chunk_tokens(chunk_ns, chunk_tokens) else 1


def itl_per_token(
    gaps: np.ndarray, chunk_ns: Sequence[int], chunk_tokens: Sequence[int] | None, completion_tokens: float
) -> tuple[np.ndarray, np.ndarray]:
    """ITL per token of one request, as (value per gap, how many tokens it counts for): each gap divided by the
    tokens of the later chunk, counted once per token (SGLang's definition); gaps before a 0-token chunk are left
    out. Without per-chunk tokens each gap carries the request's mean `(completion_tokens − 1) / gaps` and counts
    once; none when `completion_tokens` is unknown or ≤ 1. `gaps` from `itl_gaps` (any unit)."""
    if chunk_tokens is not None and has_chunk_tokens(chunk_ns, chunk_tokens):
        k = np.asarray(chunk_tokens[1:], dtype=np.int64)
        keep = k > 0
        return gaps[keep] / k[keep], k[keep]
    c = completion_tokens
    if gaps.size and c is not None and not math.isnan(c) and c > 1:
        return gaps / ((c - 1) / gaps.size), np.ones(gaps.size, dtype=np.int64)
    return gaps[:0], np.zeros(0, dtype=np.int64)


def tpot(
    chunk_ns: Sequence[int],
    chunk_tokens: Sequence[int] | None,
    completion_tokens: float | None,
    unit: float = NS_PER_MS,
) -> float:
    """TPOT of one request: `(chunk_ns[-1] − chunk_ns[0]) / (completion_tokens − tokens of the first chunk)`, in
    ms (or ns / `unit`); NaN for a request with one chunk, or no more tokens than its first chunk carried."""
    c = completion_tokens
    if c is None or math.isnan(c) or len(chunk_ns) < 2:
        return math.nan
    first = first_chunk_tokens(chunk_ns, chunk_tokens)
    if c <= first:
        return math.nan
    return (chunk_ns[-1] - chunk_ns[0]) / unit / (c - first)


def decode_tokens_per_s(tpot_ms):
    """Decode speed per request (the "per-request tok/s"): `1000 / tpot_ms`; NaN where TPOT is NaN or not > 0."""
    t = np.asarray(tpot_ms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, 1000.0 / t, np.nan)


# ---------------------------------------------------------------- a records table


@dataclass
class RequestMetrics:
    """Every per-request metric of a records table, one value per row (NaN where the row has none: a failed
    request, or a TPOT of a one-chunk request), in ms. `itl_ms` and `itl_per_token_ms` are pooled over the
    requests in row order, with `*_owner` the row each value belongs to."""

    ttft_ms: np.ndarray
    ttft_from_scheduled_ms: np.ndarray
    e2e_ms: np.ndarray
    e2e_from_scheduled_ms: np.ndarray
    tpot_ms: np.ndarray
    decode_tokens_per_s: np.ndarray
    schedule_lag_ms: np.ndarray  # every row, failed ones included (client overhead)
    max_itl_ms: np.ndarray  # largest gap per request; 0 when it has none (for per-request ITL SLOs)
    itl_ms: np.ndarray
    itl_owner: np.ndarray
    itl_per_token_ms: np.ndarray
    itl_per_token_owner: np.ndarray

    def per_request_slo_values(self) -> dict[str, np.ndarray]:
        """What a per-request SLO on ttft, e2e, tpot or itl judges (for itl: the request's largest gap)."""
        return {"ttft": self.ttft_ms, "e2e": self.e2e_ms, "tpot": self.tpot_ms, "itl": self.max_itl_ms}


def _col(table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def lead_completion_tokens(table) -> np.ndarray:
    """Completion tokens of the choice whose chunks `chunk_ns` holds: the usage's count, or with n > 1 the lead
    choice's own count (NaN when the server did not say per choice), so TPOT and per-token ITL are one answer's."""
    comp = _col(table, "completion_tokens")
    if "choices" not in table.column_names:
        return comp
    many = np.flatnonzero(np.nan_to_num(_col(table, "choices")) > 1)
    if many.size:
        lead = table.column("lead_choice").to_pylist()
        per = table.column("choice_completion_tokens").to_pylist()
        for i in many:
            comp[i] = lead_tokens(comp[i], 2, lead[i], per[i])
    return comp


def lead_tokens(
    completion_tokens: float | None, choices: int | None, lead_choice: int | None, choice_tokens: Sequence | None
) -> float:
    """`lead_completion_tokens` of one request: its usage's count with one choice, else the lead choice's own count
    (NaN when the server did not say per choice). The live views (exporter, Locust UI) divide TPOT by this too."""
    if not choices or choices <= 1:
        return math.nan if completion_tokens is None else float(completion_tokens)
    if choice_tokens and lead_choice is not None and 0 <= lead_choice < len(choice_tokens):
        own = choice_tokens[lead_choice]
        return math.nan if own is None else float(own)
    return math.nan


def record_lead_tokens(record: Mapping) -> float:
    """`lead_tokens` of one record given as a mapping of records.py's columns (a live batch's row)."""
    return lead_tokens(
        record.get("completion_tokens"),
        record.get("choices"),
        record.get("lead_choice"),
        record.get("choice_completion_tokens"),
    )


def _pool(values: list[np.ndarray], owners: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not values:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    return np.concatenate(values), np.concatenate(owners).astype(np.int64)


def request_metrics(table, ok: np.ndarray | None = None) -> RequestMetrics:
    """Every per-request metric of a records table (pyarrow, columns of servesweep.results.records). `ok`: the rows that
    count (successful requests); the others get NaN (0 for `max_itl_ms`) and no ITL gaps. Default: every row."""
    n = table.num_rows
    ok = np.ones(n, dtype=bool) if ok is None else np.asarray(ok, dtype=bool)
    sched, sent = _col(table, "scheduled_ns"), _col(table, "sent_ns")
    first, end = _col(table, "first_token_ns"), _col(table, "end_ns")
    completion = lead_completion_tokens(table)
    tpot_v = np.full(n, np.nan)
    max_itl = np.zeros(n)
    itl_v: list[np.ndarray] = []
    itl_o: list[np.ndarray] = []
    tok_v: list[np.ndarray] = []
    tok_o: list[np.ndarray] = []
    chunks = table.column("chunk_ns").to_pylist()
    toks = table.column("chunk_tokens").to_pylist()
    for i in np.flatnonzero(ok):
        ch = chunks[i]
        if not ch:
            continue
        gaps = itl_gaps(ch)
        if gaps.size:
            max_itl[i] = gaps.max()
            itl_v.append(gaps)
            itl_o.append(np.full(gaps.size, i))
        values, counts = itl_per_token(gaps, ch, toks[i], completion[i])
        per = np.repeat(values, counts)
        if per.size:
            tok_v.append(per)
            tok_o.append(np.full(per.size, i))
        tpot_v[i] = tpot(ch, toks[i], completion[i])
    itl, itl_owner = _pool(itl_v, itl_o)
    itl_tok, itl_tok_owner = _pool(tok_v, tok_o)
    return RequestMetrics(
        ttft_ms=np.where(ok, ttft(first, sent), np.nan),
        ttft_from_scheduled_ms=np.where(ok, ttft(first, sched), np.nan),
        e2e_ms=np.where(ok, e2e(end, sent), np.nan),
        e2e_from_scheduled_ms=np.where(ok, e2e(end, sched), np.nan),
        tpot_ms=tpot_v,
        decode_tokens_per_s=decode_tokens_per_s(tpot_v),
        schedule_lag_ms=schedule_lag(sent, sched),
        max_itl_ms=max_itl,
        itl_ms=itl,
        itl_owner=itl_owner,
        itl_per_token_ms=itl_tok,
        itl_per_token_owner=itl_tok_owner,
    )


# ---------------------------------------------------------------- goodput


def good_requests(
    values: Mapping[str, np.ndarray], ok: np.ndarray, slos: Iterable[tuple[str, str, float]]
) -> np.ndarray:
    """Which requests are *good* (docs/metrics.md, SLOs and goodput): successful and meeting every per-request
    SLO, given as (metric in PER_REQUEST, operator, limit in ms); a NaN value never meets one.
    `values`: RequestMetrics.per_request_slo_values() or the same keys for one request."""
    good = np.asarray(ok, dtype=bool).copy()
    for metric, op, limit in slos:
        v = np.asarray(values[metric], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            good &= ~np.isnan(v) & OPS[op](np.nan_to_num(v, nan=np.inf), limit)
    return good


def meets_slos(values: Mapping[str, float], slos: Iterable[tuple[str, str, float]]) -> bool:
    """One successful request's `good_requests`: whether its values meet every per-request SLO."""
    return all(not math.isnan(values[m]) and bool(OPS[op](values[m], limit)) for m, op, limit in slos)


def goodput(good: np.ndarray, measured: int, window_s: float) -> tuple[int, float, float]:
    """(good requests, good / measured requests, good per second of the measurement window)."""
    g = int(np.count_nonzero(good))
    return g, float(g) / measured, float(g) / window_s
