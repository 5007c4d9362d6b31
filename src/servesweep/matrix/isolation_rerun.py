"""Isolation measured, not assumed: a packed run re-runs a sample of its points alone.

Co-located servers share the host's CPU, memory bandwidth, PCIe and power, so a packed point may differ from the
same point measured alone. When a run is packed (two placements or more), the first point of each placed
configuration gets a twin, `<point>-alone` (`isolation_of` names the packed point; labels `packing: alone`, the
packed points `packing: packed`), added to the manifest when the packing is planned so a resume finds it. The lanes
skip the twins; after the packed phase, with nothing else running, each configuration's server is started again on
its placement (same host, GPUs, port), its twins run, the server is stopped. Then results/isolation.analyze sets
the manifest's `isolation` (per configuration: change alone -> packed of TTFT p50 and output tok/s with a
bootstrap interval, flagged above 10 %), shown by the report and exported as
`servesweep_isolation_change_ratio{config, metric, flagged}`.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from servesweep.results import manifest as mf
from servesweep.results.isolation_analysis import analyze
from servesweep.results.packing import ALONE, PACKED, is_isolation_sample

SUFFIX = "-alone"
POLL_S = 0.2


def add_samples(m: mf.Manifest, packing: dict[str, Any]) -> list[str]:
    """Label the packed points and add the alone twin of each placed configuration's first point; returns the
    twins' ids (none when fewer than two placements: nothing ran side by side)."""
    if len(packing.get("placements") or []) < 2:
        return []
    placed = {pl["config"] for pl in packing["placements"]}
    twins: dict[str, mf.PointEntry] = {}
    for pid, p in m.points_typed().items():
        if p.config_id not in placed or p.isolation_of is not None:
            continue
        labels = {**(p.point.get("labels") or {}), "packing": PACKED}
        m.update_point(pid, point={**p.point, "labels": labels})
        if (
            p.status in mf.FINISHED
            or p.status == mf.SERVER_FAILED
            or p.config_id in {t.config_id for t in twins.values()}
        ):
            continue
        twin = copy.deepcopy(m.points[pid])
        twin.update(status=mf.PENDING, attempts=0, isolation_of=pid)
        twin["point"].update(point_id=pid + SUFFIX, labels={**labels, "packing": ALONE})
        twins[pid + SUFFIX] = m.add_point(pid + SUFFIX, twin)
    return list(twins)


def pending_samples(m: mf.Manifest, cid: str) -> list[str]:
    return [
        pid
        for pid, p in m.points_typed().items()
        if p.config_id == cid and p.isolation_of is not None and p.status not in mf.FINISHED
    ]


def _run_alone(lane, interrupted: type[BaseException], todo: list[str]) -> None:
    """One configuration's twins on its placement's server, started for them and stopped after."""
    cid = lane.placement["config"]
    for aid in todo:
        lane.m.update_point(aid, point={**lane.m.point(aid).point, "base_url": lane.base_url()})
    lane.m.update_config(cid, server_stopped=None)
    lane.m.save()
    managed = lane.exp.target.managed
    try:
        lane.console.rule(f"{cid} alone: {', '.join(todo)}")
        if managed and not lane._start_server(cid, todo):
            return
        for aid in todo:
            if lane.stop_requested:
                raise interrupted("stop")
            lane._run_point(cid, aid)
    finally:
        if managed and not lane.keep_server and not lane.main.stop_requested:
            lane.stop_server()


def run_samples(
    runner, packing: dict[str, Any], interrupted: type[BaseException], lane_cls: Callable[..., object]
) -> None:
    """The isolation phase: each configuration's twins alone, one configuration at a time (a thread, so the main
    thread keeps taking signals as during the packed phase), then the analysis into the manifest."""
    for pl in packing["placements"]:
        todo = pending_samples(runner.m, pl["config"])
        if not todo:
            continue
        errors: list[BaseException] = []

        def go(pl=pl, todo=todo, errors=errors) -> None:
            try:
                _run_alone(lane_cls(runner, pl, interrupted), interrupted, todo)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
                errors.append(e)

        t = threading.Thread(target=go, name=f"alone-{pl['slot']}", daemon=True)
        t.start()
        try:
            while t.is_alive():
                t.join(timeout=POLL_S)
        except BaseException:
            runner.stop_requested = True
            while t.is_alive():
                t.join(timeout=POLL_S)
            raise
        if errors:
            raise errors[0]
    report(runner)


def report(runner) -> None:
    """Analyze the finished twins, keep the result in the manifest, print it, export it."""
    if not any(is_isolation_sample(p) for p in runner.m.points.values()):
        return
    iso = analyze(runner.run_dir, runner.m.data)
    runner.m.data["isolation"] = iso
    runner.m.save()
    for row in iso["configs"]:
        text = ", ".join(
            f"{c['metric']} {_pct(c['change'])} [{_pct(c['ci_low'])}, {_pct(c['ci_high'])}]"
            for c in row["changes"]
        )
        flag = f"[bold red]FLAGGED (>{iso['threshold']:.0%})[/] " if row["flagged"] else ""
        runner.event(f"isolation {row['config']}: {flag}packed vs alone {text}")
    _export(runner, iso)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f} %"


def _export(runner, iso: dict[str, Any]) -> None:
    """servesweep_isolation_change_ratio{config, metric, flagged} on the run's exporter (observe/exporter.py)."""
    if runner.metrics is not None:
        runner.metrics.set_isolation(iso)
