"""Capacity at SLO as Prometheus gauges: one series per search × tier of a run with a `search:` block, from the rows
of its capacity.json (matrix/capacity_run.py writes them; docs/capacity.md). The Matrix dashboard's capacity table
queries them; the exporter (observe/exporter.py) exposes them live as each search finishes, and for a finished run
folder (`ClientMetrics.load_run`).

Labels: `run_id`, `search`, `config`, `tier`, `axis` (concurrency or rate), `workload`, `prompt_tokens`,
`output_tokens`, `stop` (why the search ended), `binding` (the SLO furthest past its threshold at the failing end).
A value the row lacks (no capacity: the tier fails at the lower bound; no failing end: it passes at the upper)
is left out, never invented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily

PREFIX = "servesweep_capacity"
LABELS: tuple[str, ...] = (
    "run_id", "search", "config", "tier", "axis", "workload", "prompt_tokens", "output_tokens", "stop", "binding",
)  # fmt: skip


def _bracket(i: int):
    return lambda r: (r.get("bracket") or [None, None])[i]


def _at(key: str, scale: float = 1.0):
    def get(r: Mapping[str, Any]) -> float | None:
        v = (r.get("at_capacity") or {}).get(key)
        return None if v is None else v * scale

    return get


def _energy(key: str):
    """A figure of the row's `energy` at capacity (results/capacity.add_energy; None without GPU telemetry)."""
    return lambda r: (r.get("energy") or {}).get(key)


# metric suffix -> (help, how to read it from a capacity row)
GAUGES: dict[str, tuple[str, Any]] = {
    "": ("Capacity at SLO: the largest load (concurrency, or req/s for axis=rate) at which every SLO of the tier "
         "held (the last passing load of the search's bracket).", lambda r: r.get("capacity")),
    "_bracket_low": ("Lower end of the search's final bracket (last passing load).", _bracket(0)),
    "_bracket_high": ("Upper end of the search's final bracket (first failing load).", _bracket(1)),
    "_gpus": ("GPUs one server of the configuration holds (tp × dp × pp, or launcher.gpus).", lambda r: r.get("gpus")),
    "_probes": ("Distinct loads the search measured when the tier was settled.", lambda r: r.get("probes")),
    "_output_tokens_per_second_per_gpu": ("Output tokens per second per GPU at capacity.",
                                          _at("output_tokens_per_s_per_gpu")),
    "_request_rate_per_second_per_gpu": ("Successful requests per second per GPU at capacity.",
                                         _at("request_rate_per_gpu")),
    "_ttft_p99_seconds": ("TTFT p99 at capacity, seconds.", _at("ttft_p99_ms", 1e-3)),
    "_itl_p99_seconds": ("ITL per chunk p99 (pooled gaps between chunks) at capacity, seconds.", _at("itl_p99_ms", 1e-3)),
    "_decode_tokens_per_second_p50": ("Per-request output speed (decode tok/s), median over requests, at capacity.",
                                      _at("decode_tokens_per_s_p50")),
    # energy at capacity: the probe's GPUs (every call at that load pooled), where a GPU sampler measured them
    "_output_tokens_per_joule": ("Output tokens per joule of GPU energy at capacity (idle included).",
                                 _energy("output_tokens_per_joule")),
    "_joules_per_output_token": ("GPU energy per output token at capacity, J (idle included).",
                                 _energy("joules_per_output_token")),
    "_gpu_power_average_watts": ("The GPUs' average power at capacity, W.", _energy("power_avg_w")),
    "_per_kilowatt": ("Capacity per kW of the GPUs' average power at capacity.", _energy("capacity_per_kw")),
}  # fmt: skip


def labels_of(run_id: str, row: Mapping[str, Any]) -> list[str]:
    """The label values of one capacity row, in LABELS order."""
    vals = {k: row.get(k) for k in LABELS} | {"run_id": run_id}
    return ["" if vals[k] is None else str(vals[k]) for k in LABELS]


def capacity_families(run_id: str, rows: Iterable[Mapping[str, Any]]) -> list[GaugeMetricFamily]:
    """The capacity gauges of a run's capacity rows (an empty family per gauge when there are none)."""
    fams = {k: GaugeMetricFamily(PREFIX + k, h, labels=list(LABELS)) for k, (h, _get) in GAUGES.items()}
    for r in rows:
        lv = labels_of(run_id, r)
        for k, (_h, get) in GAUGES.items():
            v = get(r)
            if v is not None:
                fams[k].add_metric(lv, float(v))
    return list(fams.values())


# The frontier of capacity.json (every probe of every search: throughput per GPU against per-user speed, `pareto`
# marking the Pareto frontier across configurations, computed once by matrix/capacity_run.py so that the report and
# the dashboard mark the same points). One series per search × probed load.
FRONTIER_PREFIX = "servesweep_frontier"
FRONTIER_LABELS: tuple[str, ...] = ("run_id", "search", "config", "load")
FRONTIER_GAUGES: dict[str, tuple[str, str]] = {
    "_pareto": ("1 when the probe is on the Pareto frontier across configurations (no other probe of the run has "
                "both more output tok/s per GPU and more per-user output tok/s), else 0.", "pareto"),
    "_output_tokens_per_second_per_gpu": ("Output tokens per second per GPU at the probed load.",
                                          "tokens_per_s_per_gpu"),
    "_decode_tokens_per_second_p50": ("Per-request output speed (decode tok/s), median over the probe's requests.",
                                      "user_tokens_per_s"),
    "_output_tokens_per_joule": ("Output tokens per joule of GPU energy at the probed load (a GPU sampler's).",
                                 "output_tokens_per_joule"),
    "_energy_pareto": ("1 when the probe is on the energy frontier (no other probe has both more output tok/s per GPU "
                       "and more output tokens per joule), else 0; absent without GPU telemetry.", "energy_pareto"),
}  # fmt: skip


def frontier_families(run_id: str, points: Iterable[Mapping[str, Any]]) -> list[GaugeMetricFamily]:
    """The frontier gauges of capacity.json's `frontier` entries (an empty family per gauge when there are none)."""
    fams = {
        k: GaugeMetricFamily(FRONTIER_PREFIX + k, h, labels=list(FRONTIER_LABELS))
        for k, (h, _key) in FRONTIER_GAUGES.items()
    }
    for p in points:
        lv = [run_id, str(p.get("search") or ""), str(p.get("config") or ""), f"{p.get('load', '')}"]
        for k, (_h, key) in FRONTIER_GAUGES.items():
            v = p.get(key)
            if key == "energy_pareto" and p.get("output_tokens_per_joule") is None:
                continue  # no telemetry: off the energy frontier says nothing
            if v is not None:
                fams[k].add_metric(lv, float(v))
    return list(fams.values())
