"""The manifest of a `servesweep run` (`runs/<run_id>/manifest.json`; the folder around it: servesweep.results.runfolder),
the one file that says what a run is and how far it got.

Its shape is ManifestFile, one schema version (SCHEMA_VERSION, 1): every key a run writes is declared there, typed,
with the entries of `points` (PointEntry), `configs` (ConfigEntry) and a capacity run's `searches` (SearchEntry), and
`experiment` is the Experiment itself (its checks across fields included). A resume loads the file through it, so a
damaged, foreign or no longer valid manifest is refused naming the file and the field; a save checks the same, so a
run never writes a manifest its resume would refuse. The format on disk is the one servesweep wrote before the
model existed (same keys, schema_version 1, a later stage's keys absent until it sets them): a run folder of that
code resumes as it is, and runfolder.load_run reads both; there is no earlier version to read.

Between load and save the run holds the manifest as the JSON it is (`Manifest.data`). A point's or a configuration's
entry is read typed (`Manifest.point(pid).status`, `points_typed()`, `config(cid)`: checked copies) and changed
through `update_point` / `update_config` / `add_point`, each checked against its model and made under the manifest's
one lock, the lock its save takes: a packed run's lanes change and save it from one thread per placement. The
top-level fields have typed properties. Every save is atomic (store.write_json_atomic): a run killed
at any instant leaves either the previous or the next manifest, never a torn one; that is what
`servesweep run --resume` trusts.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servesweep.config.experiment import Experiment
from servesweep.results.store import MANIFEST, write_json_atomic

SCHEMA_VERSION: Final = 1

# Point statuses. Finished ones are never run again on resume; the others are.
DONE: Final = "done"
PENDING: Final = "pending"
RUNNING: Final = "running"
FAILED: Final = "failed"  # the load point itself failed (the load generator raised)
SERVER_FAILED: Final = (
    "server_failed"  # its server configuration did not start, failed verification or crashed
)
INFEASIBLE: Final = "infeasible"  # dropped by the planner, with a reason
FINISHED = {DONE, INFEASIBLE}
# a point entry's copy of its summary's headline, written before issue 29: loaded, ignored, not written again
LEGACY_RESULT: Final = "result"
PointStatus = Literal["done", "pending", "running", "failed", "server_failed", "infeasible"]
ConfigStatus = Literal["pending", "infeasible", "starting", "ready", "failed", "crashed", "done"]
RunStatus = Literal["created", "running", "finished", "interrupted"]


class _Entry(BaseModel):
    # every key is declared: one the model does not know is an error on load and on save
    model_config = ConfigDict(extra="forbid")


class PointEntry(_Entry):
    """A load point of the run: the LoadPoint as JSON (what run_point gets back on resume; checked as a LoadPoint
    when it runs), its axes, its status and what running it added."""

    point: dict[str, Any]
    config_id: str
    workload: str
    endpoint: str
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    rate: float | None = None  # an open-loop point's arrival rate; absent from a closed-loop point's entry
    status: PointStatus = PENDING
    reason: str | None = None  # why it is infeasible, failed or not run
    warnings: list[str] = Field(default_factory=list)
    est_s: float | None = None  # the planner's estimate
    attempts: int = 0
    dir: str | None = None  # its folder under the run folder, once done (its figures: summary.json there)
    started: str | None = None  # ISO 8601, the last attempt's
    finished: str | None = None
    cache_flushed: bool | None = None  # the server's prefix cache was flushed before it (None: not asked)
    records_aside: str | None = (
        None  # an interrupted or crashed attempt's records, relative to the run folder
    )
    server_log: str | None = None  # the log of the server that died during it
    server_lost: str | None = None  # what became of its server during it (died, hung), when it was lost
    isolation_of: str | None = None  # an isolation twin's packed point (matrix/isolation_rerun.py)
    # a capacity search's probe (matrix/capacity_run.py): its search, the load it probed and the requests asked
    search: str | None = None
    load: float | None = None
    asked: int | None = None
    probe_wall_s: float | None = None
    speedup: float | None = None  # a replay probe's trace speed-up
    # a decision's probe (matrix/decision_run.py): its cell (config/shape) and which look of the probe it is (a
    # look after the first is a top-up: a new Locust start at the same load, its records added to the earlier ones)
    decide: str | None = None
    look: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_result_copy(cls, v: Any) -> Any:
        # a manifest written before issue 29 kept a copy of the summary's headline (`result`); the point's figures
        # are its summary.json's alone, so the copy is read and dropped
        if isinstance(v, dict) and LEGACY_RESULT in v:
            v = {k: x for k, x in v.items() if k != LEGACY_RESULT}
        return v

    @model_validator(mode="after")
    def _axes_are_the_points(self) -> PointEntry:
        # the axes are kept beside the point for the readers of the JSON (reports, the exporter, scripts); they are
        # the point's own values, never a second truth
        if self.point:
            mine = (self.endpoint, self.concurrency, self.prompt_tokens, self.output_tokens, self.rate)
            pt = self.point
            its = (pt.get("endpoint"), pt.get("concurrency"), pt.get("prompt_tokens"), pt.get("output_tokens"))
            if mine != (*its, pt.get("rate_rps")):
                raise ValueError(
                    f"endpoint, concurrency, prompt_tokens, output_tokens, rate {mine} differ from the point's "
                    f"{(*its, pt.get('rate_rps'))}"
                )
        return self


class ConfigEntry(_Entry):
    """A server configuration of the run: what the planner made of it, then its server's state."""

    order: int
    flags: dict[str, Any]
    env: dict[str, Any] = Field(default_factory=dict)
    bundle: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    status: ConfigStatus = "pending"
    error: str | None = None
    planned: dict[str, Any] = Field(default_factory=dict)  # the planner's facts, warnings and estimate
    server: dict[str, Any] | None = None  # the role's resolved server info, once started
    attempts: int = 0
    started: str | None = None
    ready_after_s: float | None = None
    log: str | None = None  # the server's log, fetched when it failed or crashed
    crashes: list[dict[str, Any]] = Field(default_factory=list)  # {t, point, log} per crash
    restarts: int = 0
    needle_accuracy: dict[str, Any] | None = None  # per prompt length (matrix/answer_probes.py)
    placement: dict[str, Any] | None = None  # a packed run's host, GPUs and port (matrix/packed.py)
    server_stopped: bool | None = None


class SearchEntry(_Entry):
    """A capacity search (matrix/capacity_run.py): the point its probes are made from, its status and result."""

    template: dict[str, Any]  # a PointEntry as JSON
    config_id: str
    status: PointStatus = PENDING
    reason: str | None = None
    planned: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    started: str | None = None
    finished: str | None = None


class DecisionEntry(_Entry):
    """A run's `decide:` block (matrix/decision_run.py): the point each cell's probes are made from, the decision's
    status and how far it got; the answer itself is decision.json in the run folder."""

    templates: dict[str, dict[str, Any]]  # cell key (config/shape) -> a PointEntry as JSON
    status: Literal["pending", "running", "finished", "budget", "failed"] = "pending"
    reason: str | None = None
    started: str | None = None
    finished: str | None = None
    elapsed_s: float = 0.0  # the decision's wall time over every attempt
    probes: int = 0
    label: str | None = None  # the anytime answer's label after the last probe
    packed: bool = False  # its probes packed over the hosts' GPUs (its lanes are the manifest's `packing`)


class Event(_Entry):
    t: str
    event: str


class ExporterInfo(_Entry):
    """Where the run's client metrics were served (observe/exporter.py)."""

    host: str
    port: int
    url: str


class ManifestFile(_Entry):
    """manifest.json of a `servesweep run`, schema_version 1."""

    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    created: str
    updated: str
    status: RunStatus = "created"
    experiment_file: str | None = None  # absolute; None for an experiment built in code
    dry_run: bool = False
    experiment: Experiment  # as run (a dry run's shrunk one)
    experiment_digest: str | None = None
    port: int  # the server's (the first placement's in a packed run on the local host)
    plan: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)
    git_rev: str | None = None
    controller: dict[str, Any] = Field(default_factory=dict)
    hosts: dict[str, Any] = Field(default_factory=dict)  # host facts by host name, gathered once per run
    configs: dict[str, ConfigEntry]
    points: dict[str, PointEntry]
    events: list[Event] = Field(default_factory=list)
    # set as the run goes (absent from the file until then)
    exporter: ExporterInfo | None = None
    resumed: list[str] = Field(default_factory=list)  # when each resume started (ISO 8601)
    error: str | None = None  # the unexpected error that stopped the run (cleared when it resumes)
    max_parallel: int | None = None  # --max-parallel (a resume keeps it)
    isolation_sample: bool = True  # --no-isolation-sample said false (a resume keeps it)
    packing: dict[str, Any] | None = None  # a packed run's placements (matrix/packed.py packing_of)
    isolation: dict[str, Any] | None = None  # packed against alone (results/isolation_analysis.py analyze)
    searches: dict[str, SearchEntry] | None = None  # a capacity run's searches (its points are their probes)
    decision: DecisionEntry | None = None  # a decide run's decision (its points are its probes)

    def as_data(self) -> dict[str, Any]:
        """The manifest's JSON: the keys given, nothing else (a later stage's keys, and an open-loop point's `rate`,
        stay absent until set), and the whole experiment."""
        data = self.model_dump(mode="json", exclude_unset=True)
        data["schema_version"] = self.schema_version
        data["experiment"] = self.experiment.model_dump(mode="json")
        return data


def _field_error(e: ValidationError) -> str:
    """The first problem of a ValidationError as 'dotted.key: message' (and how many more there are)."""
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "(top level)"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {err['msg'].removeprefix('Value error, ')}{more}"


def check(path: Path, data: Any) -> ManifestFile:
    """`data` as ManifestFile; ValueError naming the file and the first field that is wrong."""
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else None
        raise ValueError(f"{path}: schema_version {got!r}, expected {SCHEMA_VERSION}")
    try:
        return ManifestFile.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{path}: not a valid servesweep run manifest: {_field_error(e)}") from None


def _plain(o: Any) -> Any:
    """What JSON cannot hold as it is: pydantic models dumped, anything else (paths) as its str()."""
    return o.model_dump(mode="json") if hasattr(o, "model_dump") else str(o)


def now_iso() -> str:
    # milliseconds: a point of 2.6 s read 2.0 s from whole-second stamps (issue 34, item 5: the report's estimate
    # against actual time, and its ratios, were off by up to 40%)
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Manifest:
    """The run's manifest while it runs: its JSON (`data`, shaped as ManifestFile), one load and one atomic save,
    both checked against ManifestFile; typed properties for the top-level fields the run reads and sets."""

    def __init__(self, run_dir: Path, data: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.data = data
        # a packed run's lanes change and save it from one thread per placement; reentrant: a change may save
        self._lock = threading.RLock()

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST

    @classmethod
    def load(cls, run_dir: Path) -> Manifest:
        """The manifest of run folder `run_dir`, checked (FileNotFoundError, or ValueError naming the field)."""
        path = Path(run_dir) / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} does not exist: is {run_dir} a servesweep run folder?") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); the run folder is damaged") from None
        check(path, data)
        for p in data["points"].values():
            p.pop(LEGACY_RESULT, None)
        return cls(Path(run_dir), data)

    def save(self) -> None:
        with self._lock:
            self.data["updated"] = now_iso()
            # one pass of the C encoder (no indent) copies the data while no other thread can change it; the
            # indented file is written from that copy, once it is what a resume's load accepts
            snapshot = json.loads(json.dumps(self.data, default=_plain))
            check(self.path, snapshot)
            write_json_atomic(self.path, snapshot)

    # -- the typed view --

    def experiment(self) -> Experiment:
        """The experiment as run (validated again: its checks across fields included)."""
        return Experiment.model_validate(self.data["experiment"])

    @property
    def points(self) -> dict[str, dict[str, Any]]:
        """Point id -> its entry (PointEntry as JSON), for readers of the JSON; a point is read typed with point()
        and changed with update_point()."""
        return self.data["points"]

    def point(self, pid: str) -> PointEntry:
        """Point `pid`'s entry, typed (a checked copy: change it with update_point); KeyError for an unknown id."""
        with self._lock:
            return PointEntry.model_validate(self.data["points"][pid])

    def points_typed(self) -> dict[str, PointEntry]:
        """Every point's entry, typed (checked copies), in the manifest's order."""
        with self._lock:
            return {pid: PointEntry.model_validate(p) for pid, p in self.data["points"].items()}

    def update_point(self, pid: str, **changes: Any) -> PointEntry:
        """Change point `pid`'s entry under the manifest's lock (the way a lane thread changes it): the changed
        entry is checked first (a key PointEntry lacks or a value of a wrong type is a ValidationError naming it,
        and nothing changes); its new state returned. Saved by the next save()."""
        with self._lock:
            entry = self.data["points"][pid]
            new = PointEntry.model_validate({**entry, **changes})
            entry.update(changes)
            return new

    def add_point(self, pid: str, entry: dict[str, Any]) -> PointEntry:
        """A new point (a capacity or decision probe, an isolation twin), checked, under the manifest's lock."""
        with self._lock:
            new = PointEntry.model_validate(entry)
            self.data["points"][pid] = entry
            return new

    def config(self, cid: str) -> ConfigEntry:
        """Configuration `cid`'s entry, typed (a checked copy: change it with update_config)."""
        with self._lock:
            return ConfigEntry.model_validate(self.data["configs"][cid])

    def update_config(self, cid: str, **changes: Any) -> ConfigEntry:
        """Change configuration `cid`'s entry under the manifest's lock, checked first as update_point does."""
        with self._lock:
            entry = self.data["configs"][cid]
            new = ConfigEntry.model_validate({**entry, **changes})
            entry.update(changes)
            return new

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        """Configuration id -> its entry (ConfigEntry as JSON)."""
        return self.data["configs"]

    @property
    def run_id(self) -> str:
        return self.data["run_id"]

    @property
    def status(self) -> RunStatus:
        return self.data["status"]

    @status.setter
    def status(self, value: RunStatus) -> None:
        self.data["status"] = value

    @property
    def experiment_file(self) -> str | None:
        return self.data.get("experiment_file")

    @property
    def dry_run(self) -> bool:
        return bool(self.data.get("dry_run"))

    @property
    def port(self) -> int:
        return int(self.data["port"])

    @property
    def hosts(self) -> dict[str, Any]:
        return self.data["hosts"]

    def set_host_facts(self, host: str, facts: dict[str, Any]) -> None:
        with self._lock:
            self.data["hosts"][host] = facts

    def add_event(self, text: str) -> None:
        with self._lock:
            self.data["events"].append({"t": now_iso(), "event": text})

    @property
    def exporter(self) -> ExporterInfo | None:
        e = self.data.get("exporter")
        return None if e is None else ExporterInfo.model_validate(e)

    @exporter.setter
    def exporter(self, value: ExporterInfo) -> None:
        self.data["exporter"] = value.model_dump()

    @property
    def error(self) -> str | None:
        return self.data.get("error")

    @error.setter
    def error(self, value: str | None) -> None:
        if value is None:
            self.data.pop("error", None)
        else:
            self.data["error"] = value

    def resumed_now(self) -> None:
        self.data.setdefault("resumed", []).append(now_iso())

    @property
    def max_parallel(self) -> int | None:
        return self.data.get("max_parallel")

    @max_parallel.setter
    def max_parallel(self, value: int | None) -> None:
        self.data["max_parallel"] = value

    @property
    def isolation_sample(self) -> bool:
        return bool(self.data.get("isolation_sample", True))

    @isolation_sample.setter
    def isolation_sample(self, value: bool) -> None:
        self.data["isolation_sample"] = value

    @property
    def packing(self) -> dict[str, Any] | None:
        return self.data.get("packing")

    @packing.setter
    def packing(self, value: dict[str, Any]) -> None:
        self.data["packing"] = value

    def counts(self) -> dict[str, int]:
        """Points by status."""
        with self._lock:
            statuses = [p["status"] for p in self.data["points"].values()]
        return {s: statuses.count(s) for s in dict.fromkeys(statuses)}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("servesweep", "locust", "ansible-core", "ansible-runner", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def git_revision(path: Path | None = None) -> str | None:
    """The servesweep checkout's commit (with '-dirty' when it has local changes), or None outside git."""
    cwd = path or Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("-dirty" if dirty else "")


def controller_facts() -> dict[str, Any]:
    """The machine running the load generator (the server hosts' facts come from Ansible)."""
    import psutil

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": sys.executable,
        "started_unix": time.time(),
    }
