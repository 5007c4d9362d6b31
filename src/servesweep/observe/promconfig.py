"""Prometheus side of a run: scrape configuration, file-based service discovery, and backfill of finished runs.

- `write_prometheus_config(path, sd_dir=...)` writes a `prometheus.yml` that scrapes every exporter and SGLang server
  listed in `sd_dir` (file_sd, re-read by Prometheus without a restart) and, optionally, a Pushgateway.
- `write_targets(sd_dir, run_id, exporters=[...], servers=[...])` writes the target files of one run, each target
  labelled with `run_id` (and `config`, the server configuration, for servers). The orchestrator or Ansible calls it
  whenever the set of servers changes; files are replaced atomically so Prometheus never reads half a file.
- `backfill(run_dir, out_dir)` turns a finished run folder's summaries into OpenMetrics text with the run's own
  timestamps and imports it with `promtool tsdb create-blocks-from openmetrics`, so a run done while no Prometheus
  was watching appears in the History dashboard. Point Prometheus's data dir at `out_dir` (or move the blocks there);
  keep `--storage.tsdb.retention.time` longer than the history you want, or old blocks are deleted on load.
- `start_prometheus(config, data_dir)`: the one way servesweep starts a Prometheus (a test's, the observe stack's)
  and waits until it is ready; `launch_service` starts any such service (the Pushgateway, Grafana) the same way,
  as a process group of servesweep.processes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ruamel.yaml import YAML

from servesweep.files import write_atomic
from servesweep.observe.exporter import (
    AXES,
    GPU_LABEL,
    PER_GPU_SCALARS,
    PREFIX,
    SUMMARY_LATENCIES,
    SUMMARY_SCALARS,
    finished_points,
    per_gpu_values,
    summary_values,
)
from servesweep.observe.stackdir import EXPORTER_JOB, PUSHGATEWAY_JOB, SGLANG_JOB
from servesweep.observe.stackdir import LABEL_NAME as _LABEL_NAME
from servesweep.observe.stackdir import TARGET as _TARGET
from servesweep.processes import Group, start_group, stop_group, wait_ready


def prometheus_config(
    *,
    sd_dir: str | Path,
    scrape_interval: str = "5s",
    pushgateway: str | None = None,
    extra_scrape_configs: Iterable[Mapping] = (),
) -> dict:
    """The configuration as a dict (see write_prometheus_config)."""
    sd = str(sd_dir).rstrip("/")
    jobs: list[dict] = [
        {
            "job_name": EXPORTER_JOB,
            # the exporter's own run_id/point_id label its series; the target's run_id labels only `up`
            "honor_labels": True,
            "file_sd_configs": [{"files": [f"{sd}/{EXPORTER_JOB}-*.json"], "refresh_interval": "30s"}],
        },
        {
            "job_name": SGLANG_JOB,
            "file_sd_configs": [{"files": [f"{sd}/{SGLANG_JOB}-*.json"], "refresh_interval": "30s"}],
        },
    ]
    if pushgateway:
        if not _TARGET.match(pushgateway):
            raise ValueError(f"pushgateway must be host:port (no scheme), got {pushgateway!r}")
        # honor_labels: the pushed run_id/job must win over the Pushgateway's own target labels.
        jobs.append(
            {
                "job_name": PUSHGATEWAY_JOB,
                "honor_labels": True,
                "static_configs": [{"targets": [pushgateway]}],
            }
        )
    jobs.extend(dict(j) for j in extra_scrape_configs)
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": jobs,
    }


def write_prometheus_config(path: str | Path, **kw) -> Path:
    """Write prometheus.yml. kw: sd_dir (required), scrape_interval, pushgateway (host:port), extra_scrape_configs."""
    import io

    buf = io.StringIO()
    y = YAML()
    y.default_flow_style = False
    y.dump(prometheus_config(**kw), buf)
    return write_atomic(
        Path(path),
        "# Written by servesweep.observe.promconfig; targets live in file_sd files.\n" + buf.getvalue(),
    )


def _check_target(t: str, where: str) -> str:
    if not isinstance(t, str) or not _TARGET.match(t):
        raise ValueError(f"{where}: target must be host:port (no scheme, no path), got {t!r}")
    return t


def _check_labels(labels: Mapping, where: str) -> dict[str, str]:
    out = {}
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
            raise ValueError(f"{where}: label name {k!r} is not a valid Prometheus label name")
        out[k] = str(v)
    return out


def write_targets(
    sd_dir: str | Path,
    run_id: str,
    *,
    exporters: Iterable[str] = (),
    servers: Iterable[str | Mapping] = (),
    labels: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write `<sd_dir>/servesweep-<run_id>.json` and `<sd_dir>/sglang-<run_id>.json`.

    exporters: "host:port" of each ClientMetrics endpoint. servers: "host:port" or {"target": "host:port",
    "config": "<server configuration id>", "metrics_path": "/metrics", ...more labels}. Every target gets
    `run_id` (and `labels`).
    An empty list writes an empty file, which removes that run's targets of that kind.
    """
    if not run_id or not re.match(r"^[A-Za-z0-9._=-]+$", run_id):
        raise ValueError(f"write_targets: run_id {run_id!r} must be letters, digits, '.', '_', '=', '-'")
    common = {"run_id": run_id, **_check_labels(labels or {}, "write_targets labels")}
    ex = [_check_target(t, f"write_targets exporters[{i}]") for i, t in enumerate(exporters)]
    groups_ex = [{"targets": ex, "labels": common}] if ex else []
    groups_sv: list[dict] = []
    for i, s in enumerate(servers):
        where = f"write_targets servers[{i}]"
        if isinstance(s, str):
            groups_sv.append({"targets": [_check_target(s, where)], "labels": dict(common)})
        elif isinstance(s, Mapping):
            if "target" not in s:
                raise ValueError(f"{where}: a server given as a mapping needs a 'target': 'host:port' key")
            extra = _check_labels({k: v for k, v in s.items() if k not in ("target", "metrics_path")}, where)
            path = s.get("metrics_path") or "/metrics"
            if not str(path).startswith("/"):
                raise ValueError(f"{where}: metrics_path {path!r} must start with '/'")
            if path != "/metrics":  # file_sd's way to scrape another path (Prometheus' reserved label)
                extra["__metrics_path__"] = str(path)
            groups_sv.append({"targets": [_check_target(s["target"], where)], "labels": {**common, **extra}})
        else:
            raise ValueError(f"{where}: expected 'host:port' or a mapping, got {type(s).__name__}")
    sd = Path(sd_dir)
    return [
        write_atomic(sd / f"{EXPORTER_JOB}-{run_id}.json", json.dumps(groups_ex, indent=2) + "\n"),
        write_atomic(sd / f"{SGLANG_JOB}-{run_id}.json", json.dumps(groups_sv, indent=2) + "\n"),
    ]


# ---------------------------------------------------------------- backfill


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_esc(str(v))}"' for k, v in d.items()) + "}"


def run_openmetrics(run_dir: str | Path, *, step_s: float = 15.0) -> str:
    """OpenMetrics text of a finished run's point summaries, stamped with the run's own times.

    Each finished point gives the same series the live exporter keeps after `point_finished`:
    `servesweep_point_info` and the `servesweep_point_*` summary gauges, sampled every `step_s` from the point's
    start to its end, so range queries and `last_over_time` both find them.
    """
    try:
        run_id, points = finished_points(run_dir)
    except ValueError as e:
        raise ValueError(f"backfill: {e}") from None
    if not points:
        raise ValueError(f"backfill: {run_dir} holds no finished point (no */summary.json)")

    # family name -> (help, {series labels tuple -> [(t, v)]})
    fams: dict[str, tuple[str, dict[tuple, list[tuple[float, float]]]]] = {}

    def add(name: str, help_: str, labels: dict[str, str], times: list[float], v: float) -> None:
        fams.setdefault(name, (help_, {}))[1].setdefault(tuple(labels.items()), []).extend(
            (t, v) for t in times
        )

    for pt in points:
        point_id, axes, start, end = pt["point_id"], pt["axes"], pt["start"], pt["end"]
        times = [start + i * step_s for i in range(int((end - start) // step_s) + 1)]
        if times[-1] < end:
            times.append(end)
        base = {
            "run_id": run_id,
            "point_id": point_id,
            "model": axes.get("model", ""),
            "config": axes.get("config", ""),
        }
        extra = {k: v for k, v in sorted(axes.items()) if k not in AXES}
        info = {"run_id": run_id, "point_id": point_id, **{a: axes.get(a, "") for a in AXES}, **extra}
        add(
            PREFIX + "point_info",
            "One series per matrix point with its axes as labels (value 1).",
            info,
            times,
            1.0,
        )
        add(PREFIX + "point_start_timestamp_seconds", "Unix time the point started.", base, times, start)
        add(PREFIX + "point_end_timestamp_seconds", "Unix time the point finished.", base, times, end)
        values, fails = summary_values(pt["summary"])
        values |= per_gpu_values(values, axes.get(GPU_LABEL))
        for key, v in values.items():
            if "/" in key:
                name, stat = key.split("/")
                add(PREFIX + f"point_{name}_seconds", f"Point summary: {SUMMARY_LATENCIES[name]}.",
                    {**base, "stat": stat}, times, v)  # fmt: skip
            else:
                help_ = (SUMMARY_SCALARS | PER_GPU_SCALARS)[key][1]
                add(PREFIX + f"point_{key}", f"Point summary: {help_}", base, times, v)
        for err, v in fails.items():
            add(PREFIX + "point_failures", "Point summary: failed requests by error class.",
                {**base, "error_class": err}, times, v)  # fmt: skip
    lines: list[str] = []
    for name, (help_, series) in fams.items():
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} gauge")
        for lbl, samples in series.items():
            ls = _labels(dict(lbl))
            last = None
            for t, v in sorted(samples):
                if t == last:  # one sample per timestamp per series
                    continue
                last = t
                lines.append(f"{name}{ls} {v!r} {t:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    promtool: str = "promtool",
    max_block_duration: str | None = None,
) -> list[Path]:
    """Import a finished run folder into Prometheus TSDB blocks under out_dir; returns the new block folders."""
    exe = shutil.which(promtool)
    if exe is None:
        raise FileNotFoundError(
            f"backfill needs {promtool!r} on PATH (Debian package 'prometheus'); it was not found"
        )
    text = run_openmetrics(run_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out.iterdir()}
    with tempfile.TemporaryDirectory(prefix="servesweep-backfill-") as tmp:
        om = Path(tmp) / "run.om"
        om.write_text(text)
        cmd = [exe, "tsdb", "create-blocks-from", "openmetrics"]
        if max_block_duration:
            cmd.append(f"--max-block-duration={max_block_duration}")
        cmd += [str(om), str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(
                f"promtool failed ({r.returncode}) importing {run_dir}: {r.stderr.strip()[-2000:]}"
            )
    return sorted(p for p in out.iterdir() if p.name not in before and p.is_dir())


# ---------------------------------------------------------------- local Prometheus and Pushgateway


class LocalService:
    """A service process started here (Prometheus, the Pushgateway, Grafana): its process group and address."""

    def __init__(self, group: Group, url: str) -> None:
        self.group, self.url = group, url
        self.proc, self.log_path = group.popen, group.log_path

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM its group, SIGKILL what is left after `timeout`."""
        stop_group(self.group, timeout)

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers_200(url: str) -> bool:
    from servesweep.target import http

    try:
        return http.status("GET", url, timeout=2.0) == 200
    except http.ServerError:
        return False


def launch_service(
    argv: list[str],
    *,
    url: str,
    ready_path: str,
    log_path: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    watch_parent: bool = True,
    started: Callable[[Group], None] | None = None,
) -> LocalService:
    """Start argv[0] (found on PATH) as a process group, its output appended to log_path, and wait until
    url + ready_path answers 200. `watch_parent`: stopped when this process ends (False: it outlives it, as the
    observe stack's services do). `started` is called with the group as soon as it runs (to record it). A
    RuntimeError (servesweep.processes.NotReady) with the log's tail when it exits or is not ready in time."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise FileNotFoundError(f"{argv[0]!r} is not on PATH (Debian package {Path(argv[0]).name!r})")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    name = Path(exe).name
    group = start_group([exe, *argv[1:]], env=env, log_path=log_path, kind=name, watch_parent=watch_parent)
    if started is not None:
        started(group)
    wait_ready(group, lambda: _answers_200(url + ready_path), timeout, name, detail=f" ({url})")
    return LocalService(group, url)


def start_prometheus(
    config: str | Path,
    data_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 9090,
    retention: str = "3650d",
    timeout: float = 60.0,
    exe: str = "prometheus",
    log_path: Path | None = None,
    watch_parent: bool = True,
    started: Callable[[Group], None] | None = None,
) -> LocalService:
    """Start Prometheus on `config` and `data_dir` (blocks backfilled there load at start) and wait until ready.
    The long default retention keeps backfilled history: Prometheus deletes blocks older than it. The log goes to
    `log_path` (default `<data_dir>-prometheus.log`); `watch_parent` and `started` as in `launch_service`."""
    data_dir = Path(data_dir)
    cmd = [exe, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
           f"--web.listen-address={host}:{port}", f"--storage.tsdb.retention.time={retention}", "--log.level=warn"]  # fmt: skip
    log_path = log_path or data_dir.parent / f"{data_dir.name}-prometheus.log"
    return launch_service(cmd, url=f"http://{host}:{port}", ready_path="/-/ready", log_path=log_path,
                          timeout=timeout, watch_parent=watch_parent, started=started)  # fmt: skip


def start_pushgateway(
    state_dir: str | Path, *, host: str = "127.0.0.1", port: int = 9091, timeout: float = 30.0
) -> LocalService:
    """Start the Pushgateway (state persisted under state_dir) and wait until ready."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    cmd = ["prometheus-pushgateway", f"--web.listen-address={host}:{port}", f"--persistence.file={state / 'pushgateway.data'}"]  # fmt: skip
    url, log = f"http://{host}:{port}", state / "pushgateway.log"
    return launch_service(cmd, url=url, ready_path="/-/ready", log_path=log, timeout=timeout)
