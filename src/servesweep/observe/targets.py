"""The targets one run registers in the observe stack's one targets folder (observe/stackdir.py), removed together at
its end: the run's client-metrics exporter (`servesweep run`, `servesweep load`), a Locust process's exporter
(client/exporter_feed.py) and the server's /metrics. A run registers whether or not a stack is up, so a Prometheus
started later finds it. `last_scrape` keeps an exporter up until its last summary was scraped.

    t = RunTargets(run_id, results_root)
    t.exporter("127.0.0.1:9464")                       # servesweep-<run_id>-exporter.json
    t.server("127.0.0.1:30000", config="tp2")          # sglang-<run_id>-server.json (one server at a time)
    t.close()                                          # every file it wrote is removed
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from servesweep.observe.stackdir import (
    EXPORTER_JOB,
    SGLANG_JOB,
    register_targets,
    scrape_interval_s,
    stack_dir,
    unregister,
    watching_prometheus,
)

if TYPE_CHECKING:
    from servesweep.observe.exporter import ClientMetrics

# Prometheus' discovery manager passes file_sd updates on at most every 5 s (docs/observability.md, "Pick-up time").
DISCOVERY_S = 6.0

# An exporter bound to every address is scraped through loopback (the stack's Prometheus runs on this host).
_ANY = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}


def scrape_address(host: str, port: int) -> str:
    """host:port as Prometheus reaches a server bound to `host` (IPv6 in brackets)."""
    host = _ANY.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{int(port)}"


class RunTargets:
    """File_sd files of one run, each under its own key, so a new server configuration replaces the last one."""

    def __init__(self, run_id: str, root: str | Path | None = None) -> None:
        self.run_id = run_id
        self.root = root
        self._written: set[tuple[str, str]] = set()

    def _register(self, job: str, target: str, labels: dict[str, str], role: str) -> Path:
        key = f"{self.run_id}-{role}"
        path = register_targets(job, [target], {"run_id": self.run_id, **labels}, self.root, key=key)
        self._written.add((job, key))
        return path

    def exporter(self, target: str, *, role: str = "exporter") -> Path:
        """A ClientMetrics endpoint (the run's, or a Locust process's under role="locust")."""
        return self._register(EXPORTER_JOB, target, {}, role)

    def server(
        self,
        target: str,
        *,
        config: str | None = None,
        metrics_path: str = "/metrics",
        role: str = "server",
        labels: dict[str, str] | None = None,
    ) -> Path:
        """The server under test's /metrics (SGLang's `sglang:*`), labelled with its configuration; a packed run
        registers each placement's server under a role of its own, with its host and GPUs as labels."""
        labels = {**({"config": config} if config else {}), **(labels or {})}
        if metrics_path != "/metrics":
            labels["__metrics_path__"] = metrics_path
        return self._register(SGLANG_JOB, target, labels, role)

    def drop(self, job: str, role: str) -> None:
        key = f"{self.run_id}-{role}"
        unregister(job, root=self.root, key=key)
        self._written.discard((job, key))

    def __enter__(self) -> RunTargets:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove every file this run registered; Prometheus drops the targets within seconds. A stack folder that
        holds nothing else (no stack was ever started there) goes too, so a results root without a stack stays
        as it was."""
        for job, key in sorted(self._written):
            unregister(job, root=self.root, key=key)
        self._written.clear()
        top = stack_dir(self.root)
        try:
            if [p.name for p in top.iterdir()] == ["targets"] and not any((top / "targets").iterdir()):
                (top / "targets").rmdir()
                top.rmdir()
        except OSError:  # another process registered meanwhile, or the folder is gone: leave it
            pass


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def last_scrape(
    metrics: ClientMetrics,
    after: int,
    root: str | Path | None = None,
    echo: Callable[[str], None] = _to_stderr,
) -> bool | None:
    """Before an exporter stops: wait until the stack's Prometheus has read `metrics` since `after` (its `reads`
    when the last summary was set), at most the discovery delay plus two scrape intervals, so the summary gauges of
    a point that ended just before the process reach Prometheus. Only when the Prometheus `observe up` started runs
    (no other would come: None, no wait). True: scraped; False: not within the bound (`echo` says what to do)."""
    if watching_prometheus(root) is None:
        return None
    bound = DISCOVERY_S + 2 * scrape_interval_s(root)
    echo(f"servesweep: waiting up to {bound:.0f} s for Prometheus to scrape the last summary")
    if metrics.wait_read(after, bound):
        return True
    echo(
        "servesweep: Prometheus did not scrape it; `servesweep observe backfill` the run (or --records file)"
    )
    return False
