"""summary.json of a point (`<run>/<point_id>/summary.json`): its one model, `PointSummary`, with one load and one
atomic save (results/schema.py VersionedFile).

What is in it: summarize() of the point's records (results/summary.py: the figures of docs/metrics.md) and what the
driver adds (driver/point_run.py: the point, its times, the client headroom, the workers' account, the failure check,
the server's state, a replay's fidelity, the GPUs' energy) and, later, the run (matrix/answer_probes.py: the needle
accuracy). Every key is declared here, typed; one the model does not know is refused, on load and on save, naming
the file and the field. Readers take what a summary says from it; nothing recomputes a figure it holds except the
report and compare, which recompute every figure from records.parquet (with its interval) and take only what the
records cannot give from here.

Schema version 1 (`schema_version`, its one declaration; SCHEMA_VERSION): the file as servesweep wrote it before the model existed plus
`"schema_version": 1`. A summary without `schema_version` is that earlier format, with the same keys: it loads as
it is (version 0 is read as version 1; no key differs). A later stage's keys (the workers, the server's state, the
GPUs, the needle accuracy, ...) are absent until it sets them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from pydantic import Field

from servesweep.results.schema import Strict, VersionedFile

SUMMARY: Final = "summary.json"


class Stats(Strict):
    """Exact statistics of raw values (results/summary.py stats)."""

    p50: float
    p90: float
    p95: float
    p99: float
    mean: float
    min: float
    max: float
    n: int


class RequestCounts(Strict):
    total: int
    warmup: int
    measured: int
    ok: int
    failed: int


class PromptTokens(Strict):
    """Prompt-token accuracy: the target length against what the server's usage reported."""

    target: float | None
    mean: float | None
    mean_deviation_pct: float | None
    max_abs_deviation_pct: float | None
    reported: int


class Arrivals(Strict):
    rate_rps: float | None
    interarrival_cv: float | None
    n: int
    processes: int


class InFlight(Strict):
    """The time-weighted concurrency the records held (results/degraded.py in_flight)."""

    mean: float
    p50: float
    max: float


class Goodput(Strict):
    slos: list[str]
    requests: int
    ratio: float | None
    per_s: float | None


class SloCheck(Strict):
    slo: str
    value: float | None
    passed: bool = Field(alias="pass")


class FailureCheck(Strict):
    """driver/point_run.py failure_check: whether the point's failures are above its max failure rate."""

    passed: bool = Field(alias="pass")
    message: str | None
    warning: str | None
    top_error: str | None
    max_failure_rate: float | None


class Degeneration(Strict):
    judged: int
    degenerate: int
    examples: list[str]


class ProbeRequests(Strict):
    requests: dict[str, int]
    total: int


class ClientHeadroom(Strict):
    """results/summary.py client_headroom: per load-generating process, CPU and event-loop lag."""

    workers: list[dict[str, Any]]
    master: dict[str, Any] | None
    read_lag_ms: Stats | None
    client_saturated: bool
    reasons: list[str]
    limits: dict[str, float]


class PointSummary(VersionedFile):
    """summary.json of one point, schema_version 1."""

    WHAT: ClassVar[str] = "point summary"

    schema_version: Literal[1] = 1
    # the driver's (driver/point_run.py)
    point_id: str
    point: dict[str, Any]  # the LoadPoint as run, as JSON (its labels: config_id, run_id, ...)
    locust_exit_code: int
    started_unix: float
    wall_s: float
    # summarize() of the records (results/summary.py; docs/metrics.md)
    requests: RequestCounts
    window_s: float
    window_ns: list[float]
    output_tokens: float
    output_tokens_per_s: float | None
    request_rate: float | None
    error_rate: float | None
    failures: dict[str, int]
    ttft_ms: Stats | None
    ttft_from_scheduled_ms: Stats | None
    itl_ms: Stats | None
    itl_per_token_ms: Stats | None
    itl_zero_gap_share: float | None
    rx_clock: dict[str, int]
    tpot_ms: Stats | None
    e2e_ms: Stats | None
    e2e_from_scheduled_ms: Stats | None
    decode_tokens_per_s: Stats | None
    schedule_lag_ms: Stats | None
    arrivals: Arrivals | None
    in_flight: InFlight | None
    diagnosis_evidence: dict[str, Any] | None  # results/diagnosis.py record_evidence
    prompt_tokens: PromptTokens
    completion_tokens: Stats | None
    cache_hit_ratio: float | None
    goodput: Goodput | None
    slos: list[SloCheck]
    time_to_first_reasoning_ms: Stats | None
    time_to_first_answer_ms: Stats | None
    reasoning_tokens: Stats | None
    sessions: dict[str, Any] | None  # agent sessions: per turn and per session
    degenerate_rate: float | None = None  # results/degeneration.py
    degeneration: Degeneration | None = None
    # the driver's account of the point
    client_headroom: ClientHeadroom
    client_saturated: bool
    degraded: bool
    problems: list[str]
    notes: list[str]
    probe_requests: ProbeRequests
    failure_check: FailureCheck
    # set where they apply (absent otherwise)
    workers: dict[str, Any] | None = None  # worker processes' account (driver/workers.py account)
    server_state: dict[str, Any] | None = None  # results/server_state.py (None: not recorded)
    server_state_note: str | None = None  # why server_state is None
    shared_prefix: dict[str, Any] | None = None  # a shared_prefix point's target against measured hit ratio
    server_cached_tokens: float | None = None  # an agent point's cached tokens by the server's counter
    trace_fidelity: dict[str, Any] | None = None  # a replay's fidelity (results/trace_fidelity.py)
    gpu: dict[str, Any] | None = None  # the GPUs during the point (results/energy.py summary_fields)
    needle_accuracy: float | None = None  # its configuration's at its prompt length (matrix/answer_probes.py)

    @property
    def point_labels(self) -> dict[str, str]:
        return dict(self.point.get("labels") or {})


SCHEMA_VERSION: Final = PointSummary.version()


def save_summary(path: str | Path, data: dict[str, Any]) -> dict[str, Any]:
    """A summary built as JSON (driver/point_run.py) checked, then written atomically; its JSON as written."""
    return PointSummary.save_data(path, data)


def load_summary(path: str | Path) -> dict[str, Any]:
    """The checked summary's JSON, for readers that index it (results/runfolder.py PointInfo.summary)."""
    return PointSummary.load_data(path)
