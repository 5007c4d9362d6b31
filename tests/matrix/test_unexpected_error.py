"""A run that stops on an exception nobody expected (a bug of ours or of a library, raised after the server started)
leaves no server running and a manifest that says why: the user sees the traceback, the resume line, and a GPU host
that is free again. Before, the exception went straight past the run's handlers and the emulator (on a real host:
SGLang on its GPUs) kept running after servesweep exited."""

from __future__ import annotations

import io
import json
import os
import signal
import textwrap

import psutil
import pytest
from support import emulator_experiment_head


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_unexpected_error_mid_run_stops_the_server_and_keeps_the_run_resumable(tmp_path, monkeypatch, capsys):
    from rich.console import Console

    from servesweep.config.experiment import load_experiment
    from servesweep.matrix import orchestrator
    from servesweep.matrix.orchestrator import Runner
    from servesweep.matrix.run_setup import create_run

    f = tmp_path / "exp.yaml"
    f.write_text(
        emulator_experiment_head(tmp_path, "boom")
        + textwrap.dedent(
            """\
            load: {concurrency: [1, 2], prompt_tokens: 100, output_tokens: 4, requests: 2}
            flush_cache_between_points: false
            """
        )
    )
    m = create_run(load_experiment(f), tmp_path / "runs", experiment_file=str(f))
    real_run_point = Runner._run_point
    seen: dict[str, int] = {}

    def run_point_then_fail(self, cid: str, pid: str) -> bool:
        if seen:  # the first point runs; the bug strikes at the second, with the server up
            seen["server_pid"] = int(self.m.configs[cid]["server"]["pid"])
            raise RuntimeError("a bug between two points")
        seen["first"] = 1
        return real_run_point(self, cid, pid)

    monkeypatch.setattr(orchestrator.Runner, "_run_point", run_point_then_fail)
    runner = Runner(m, console=Console(file=io.StringIO(), width=200))
    try:
        with pytest.raises(RuntimeError, match="a bug between two points"):
            runner.run()
    finally:
        runner.close()

    server_pid = seen["server_pid"]
    if _alive(server_pid):  # the test's own cleanup: the group the role started, through its recorded pid
        os.killpg(server_pid, signal.SIGKILL)
        pytest.fail(f"the emulator {server_pid} outlived the run")
    man = json.loads((m.run_dir / "manifest.json").read_text())
    assert man["status"] == "interrupted" and man["error"] == "RuntimeError: a bug between two points", man
    statuses = sorted(p["status"] for p in man["points"].values())
    assert statuses == ["done", "pending"], statuses  # the measured point kept, the other one to resume
    err = capsys.readouterr().err
    assert f"servesweep run --resume {m.run_dir}" in err and "RuntimeError: a bug between two points" in err
