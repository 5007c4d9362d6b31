"""The run folder: what `servesweep run` and `servesweep load` write, and the one reader of it (`load_run`) that
report, compare, gate and the exporter use.

    runs/<run_id>/
        manifest.json        what the run is and how far it got; rewritten atomically after every change
        processes.json       the processes the run started, while they run (servesweep/processes.py OwnedProcesses)
        <point_id>/          one folder per finished point (a point folder)
            records.parquet  one row per request (results/records.py)
            summary.json     summarize() of the records plus what the driver adds: `point_id`, `point` (the
                             LoadPoint, its `labels` included), `started_unix`, `wall_s`, client headroom, ...;
                             its model results/point_summary.py `PointSummary`, checked when read here
            locust.log, clients.json, ...

manifest.json comes in two kinds, told apart by its `points`:

- `servesweep run` (`schema_version` 1, its model results/manifest.py `ManifestFile`, checked when the run saves
  it): `points` is an object, point id -> entry (`PointEntry`: config_id, workload, endpoint, prompt_tokens,
  output_tokens, concurrency, status (manifest.py's statuses), reason, warnings, est_s, started, finished (ISO 8601),
  dir, ...); `configs` is an object, config id -> `ConfigEntry` {flags, env, labels, server, ...}; beside them the
  experiment, plan, versions, git revision and host facts. Read here as it is, without the model: a report of a
  folder whose resume would be refused (a field missing, an experiment no longer valid) still shows what it holds.
- `servesweep load` (driver/load.py `LoadManifestFile`, `kind` "load"): `points` is a list of {point_id, dir, concurrency,
  rate_rps} appended as each point finishes; an interrupted point is listed with `status` "interrupted" and no
  summary.json. Point folders the list lacks (the run stopped before recording them) are read too.

A manifest without `points`, or a folder without manifest.json, is read as the point folders below it. `load_run`
also reads a single point folder and a bare records file (`locust ... --records r.parquet`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servesweep.results.point_summary import SUMMARY, load_summary
from servesweep.results.store import MANIFEST

RECORDS = "records.parquet"


class RunError(ValueError):
    """A run folder that cannot be read; the message names the path and what is wrong."""


@dataclass
class PointInfo:
    point_id: str
    config_id: str
    workload: str
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    status: str  # done, infeasible, failed, server_failed, pending, running, interrupted
    reason: str | None = None
    dir: Path | None = None
    summary: dict | None = None  # summary.json of a done point, checked against PointSummary (its JSON)
    entry: dict = field(default_factory=dict)  # the manifest's entry for the point ({} when it has none)
    est_s: float | None = None  # the planner's estimate
    actual_s: float | None = None  # measured wall time of the point
    warnings: list[str] = field(default_factory=list)
    records_file: Path | None = None  # a records file not named dir/records.parquet (a bare Locust --records)
    # what readers derive once, e.g. compare's sample of the records
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def axes(self) -> tuple[str, int, int, int]:
        return (self.workload, self.prompt_tokens, self.output_tokens, self.concurrency)

    @property
    def records_path(self) -> Path | None:
        if self.records_file is not None:
            return self.records_file
        return None if self.dir is None else self.dir / RECORDS


@dataclass
class Run:
    path: Path
    run_id: str
    kind: str  # "run" (servesweep run), "load" (servesweep load or point folders), "point", "records"
    manifest: dict
    points: list[PointInfo]

    @property
    def configs(self) -> dict[str, dict]:
        return self.manifest.get("configs") or {}

    @property
    def dry_run(self) -> bool:
        return bool(self.manifest.get("dry_run"))

    def done_points(self) -> list[PointInfo]:
        return [p for p in self.points if p.status == "done" and p.dir is not None]


def read_json(path: Path, what: str) -> dict:
    """A JSON object from a file; RunError naming the file when it is missing, not JSON or not an object."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunError(f"{path}: no {what}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: {what} is not a JSON object")
    return data


def read_summary(path: Path) -> dict:
    """A point's summary.json, checked (results/point_summary.py PointSummary), as its JSON; RunError naming the
    file and the field when it is missing, damaged or not a summary."""
    try:
        return load_summary(path)
    except (OSError, ValueError) as e:
        raise RunError(str(e)) from None


def iso_unix(text: str | None) -> float | None:
    """Unix seconds of an ISO 8601 time (UTC when it names no zone); None for none or an unreadable one."""
    if not text:
        return None
    try:
        d = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()


def secs_between(a: str | None, b: str | None) -> float | None:
    """Seconds from ISO time `a` to ISO time `b`; None when either is missing or unreadable."""
    ta, tb = iso_unix(a), iso_unix(b)
    return None if ta is None or tb is None else tb - ta


def _from_summary(pid: str, d: Path, summary: dict, entry: dict | None = None) -> PointInfo:
    pt = summary.get("point") or {}
    labels = pt.get("labels") or {}
    return PointInfo(
        point_id=pid,
        config_id=labels.get("config_id", ""),
        workload=pt.get("endpoint", "chat"),
        prompt_tokens=int(pt.get("prompt_tokens", 0)),
        output_tokens=int(pt.get("output_tokens", 0)),
        concurrency=int(pt.get("concurrency", 0)),
        status="done",
        dir=d,
        summary=summary,
        entry=entry or {},
        actual_s=summary.get("wall_s"),
    )


def _records_file(path: Path) -> Run:
    """A records file by itself, e.g. what `locust -f locustfiles/llm.py --headless --records r.parquet` wrote."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as e:
        raise RunError(f"{path}: not a Parquet records file ({e})") from None
    try:
        pt = json.loads(meta.get(b"servesweep.point", b"{}"))
    except ValueError:
        pt = {}
    pid = meta.get(b"servesweep.point_id", b"").decode() or path.stem
    info = _from_summary(pid, path.parent, {"point": pt})
    info.records_file = path
    return Run(path, path.stem, "records", {}, [info])


def _matrix_points(path: Path, raw: dict) -> list[PointInfo]:
    """The points of a `servesweep run` manifest; a done point's summary.json must be there."""
    points = []
    for pid, p in raw.items():
        done = p.get("status") == "done"
        d = path / (p.get("dir") or pid) if p.get("dir") or done else None  # a done point's folder: its id
        summary = None
        if done:
            assert d is not None  # a done point has its folder
            if not (d / SUMMARY).is_file():
                raise RunError(f"{path}: point {pid} is done but its folder has no {SUMMARY}")
            summary = read_summary(d / SUMMARY)
        actual = secs_between(p.get("started"), p.get("finished"))
        if actual is None and summary is not None:
            actual = summary.get("wall_s")
        points.append(
            PointInfo(
                point_id=pid,
                config_id=p.get("config_id", ""),
                workload=p.get("workload", "chat"),
                prompt_tokens=int(p.get("prompt_tokens", 0)),
                output_tokens=int(p.get("output_tokens", 0)),
                concurrency=int(p.get("concurrency", 0)),
                status=p.get("status", "pending"),
                reason=p.get("reason"),
                dir=d,
                summary=summary,
                entry=p,
                est_s=p.get("est_s"),
                actual_s=actual,
                warnings=list(p.get("warnings") or []),
            )
        )
    return points


def _folder_points(path: Path, listed: list[dict]) -> list[PointInfo]:
    """The points a `servesweep load` manifest lists, then every other point folder (one with summary.json)."""
    points, seen = [], set()
    for p in listed:
        d = path / p.get("dir", p["point_id"])
        seen.add(d.name)
        if p.get("status", "done") != "done":
            points.append(PointInfo(p["point_id"], "", "chat", 0, 0, int(p.get("concurrency") or 0), p["status"],
                                    dir=d, entry=p))  # fmt: skip
            continue
        points.append(_from_summary(p["point_id"], d, read_summary(d / SUMMARY), p))
    for d in sorted(x for x in path.iterdir() if x.is_dir() and x.name not in seen):
        if (d / SUMMARY).is_file():
            s = read_summary(d / SUMMARY)
            points.append(_from_summary(s.get("point_id") or d.name, d, s))
    return points


def load_run(path: str | Path) -> Run:
    """Read a run folder (servesweep run or load), a point folder or a records.parquet file; `runs/<id>:<config>`
    keeps one server configuration of a run (to compare configurations of one run). Raises RunError naming what is
    wrong."""
    path = Path(path)
    if not path.exists() and ":" in path.name:
        folder, _, cfg = str(path).rpartition(":")
        run = load_run(folder)
        pts = [p for p in run.points if p.config_id == cfg]
        if not pts:
            have = sorted({p.config_id for p in run.points if p.config_id})
            raise RunError(f"{folder}: no configuration {cfg!r}; it has {', '.join(have) or 'none'}")
        run.points = pts
        run.run_id = f"{run.run_id}:{cfg}"
        return run
    if not path.exists():
        raise RunError(f"{path}: no such run folder")
    if path.is_file() and path.suffix == ".parquet":
        return _records_file(path)
    if not path.is_dir():
        raise RunError(f"{path}: not a folder (give runs/<run_id>) nor a records .parquet file")
    mpath = path / MANIFEST
    if not mpath.is_file() and (path / SUMMARY).is_file():
        s = read_summary(path / SUMMARY)
        return Run(path, path.name, "point", {}, [_from_summary(s.get("point_id") or path.name, path, s)])
    m = read_json(mpath, "manifest") if mpath.is_file() else {}
    raw = m.get("points")
    if isinstance(raw, dict):
        return Run(path, m.get("run_id") or path.name, "run", m, _matrix_points(path, raw))
    if raw is not None and not isinstance(raw, list):
        raise RunError(
            f"{mpath}: 'points' is neither an object (servesweep run) nor a list (servesweep load)"
        )
    points = _folder_points(path, raw or [])
    if not m and not points:
        raise RunError(
            f"{path}: no {MANIFEST}, and it holds no finished point (*/{SUMMARY}); not a servesweep run folder"
        )
    return Run(path, m.get("run_id") or path.name, "load", m, points)
