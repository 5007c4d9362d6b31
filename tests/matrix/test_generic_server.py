"""`servesweep run` with a generic OpenAI-compatible server (launcher.command, an argv template), not SGLang: the
emulator launched through the template as any other server would be, with a server axis that needs a restart, no
verification and no cache flush. The role renders the template and the flags, waits for /health, and records what
it ran; a bad template and a server that exits at once give clear errors (the server log's tail in the message)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import SERVESWEEP
from support import start_servesweep as start
from test_reliability_server import cleanup, manifest, run_dir_of

from servesweep.config.experiment import Experiment, ExperimentError, parse_experiment
from servesweep.matrix.planner import GENERIC_UNPLANNED, make_plan, plan_json

TEMPLATE = '["{python}", "-m", "servesweep.sim", "--model-path", "{model_path}", "--host", "{host}", "--port", "{port}", "--sim-load-time", "0.1"]'


def generic_experiment(tmp: Path, *, name: str, command: str = TEMPLATE, axes: str = "") -> Path:
    text = textwrap.dedent(
        f"""\
        name: {name}
        target: {{inventory: local, port: 0}}
        model: {{path: Qwen/Qwen3.6-27B, served_model_name: my-model}}
        launcher:
          python: {sys.executable}
          command: {command}
          verify: false
          flush_cache_path: null
          workdir: {tmp / "srv"}
          startup_timeout_s: 60
          stop_timeout_s: 20
        server:
          base: {{context_length: 4096, max_running_requests: 8}}
        {axes}
        load:
          concurrency: [2]
          prompt_tokens: [64]
          output_tokens: [8]
          requests: 4
        """
    )
    path = tmp / "exp.yaml"
    path.write_text(text)
    return path


def run_to_end(tmp: Path, exp: Path, timeout_s: float = 240) -> tuple[int, str, Path | None]:
    runs = tmp / "runs"
    proc = start(["run", str(exp), "--out", str(runs)], tmp, tmp / "run.log")
    run_dir = None
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        run_dir = run_dir_of(runs)
        rc = proc.wait(timeout=30)
    finally:
        cleanup(proc, run_dir, tmp / "srv")
    return rc, (tmp / "run.log").read_text(), run_dir


def test_a_generic_server_runs_the_matrix_with_a_restart_per_configuration(tmp_path):
    # enable_metrics true renders a bare flag, false leaves it out: two launches, two configurations
    exp = generic_experiment(tmp_path, name="generic", axes="  axes: {enable_metrics: [true, false]}")
    rc, out, run_dir = run_to_end(tmp_path, exp)
    assert rc == 0, out[-3000:]
    m = manifest(run_dir)
    assert len(m["configs"]) == 2 and len(m["points"]) == 2
    for p in m["points"].values():
        assert p["status"] == "done", p
        req = json.loads((run_dir / p["dir"] / "summary.json").read_text())["requests"]
        assert req["ok"] == 4 and req["failed"] == 0, req
        assert p["cache_flushed"] is None  # flush_cache_path null: no SGLang-only /flush_cache
    infos = {
        cid: json.loads((run_dir / "servers" / cid / "server_info.json").read_text()) for cid in m["configs"]
    }
    pids = {info["pid"] for info in infos.values()}
    assert len(pids) == 2 and all(pids), f"each configuration is its own server start: {pids}"
    for cid, info in infos.items():
        port = str(m["port"])
        head = [
            sys.executable,
            "-m",
            "servesweep.sim",
            "--model-path",
            "Qwen/Qwen3.6-27B",
            "--host",
            "127.0.0.1",
        ]
        assert info["argv"][: len(head)] == head and info["argv"][len(head) : len(head) + 2] == [
            "--port",
            port,
        ]
        flags = info["argv"][len(head) + 2 :]
        assert flags[:2] == ["--sim-load-time", "0.1"], flags  # the rest of the template, then the flags
        want = ["--context-length", "4096", "--max-running-requests", "8"]
        if m["configs"][cid]["flags"]["enable_metrics"]:
            want = want[:2] + ["--enable-metrics"] + want[2:]  # sorted by name, true bare
        assert flags[2:] == want, flags
        assert info["server"] == "generic"
        assert float(info["ready"]["health_after_s"]) >= 0 and info["mismatches"] == []
        assert info["server_info"] == {} and info["info"] == {}  # generic default: no SGLang documents read
    # no metrics_path: a generic server's /metrics is not scraped as SGLang's (transformers serve has none)
    # and the run took its targets out of the observe stack's folder when it ended
    assert not list((run_dir.parent / ".observe" / "targets").glob("*.json"))
    # the requests named the experiment's model (never the first of /v1/models)
    point_dir = run_dir / next(iter(m["points"]))
    assert json.loads((point_dir / "summary.json").read_text())["point"]["model"] == "my-model"


def test_an_unknown_placeholder_is_an_experiment_error_naming_the_line(tmp_path):
    bad = TEMPLATE.replace("{model_path}", "{modelpath}")
    exp = generic_experiment(tmp_path, name="badtemplate", command=bad)
    r = subprocess.run(
        [*SERVESWEEP, "run", str(exp), "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        f"{exp}:6: launcher.command: item 4 ('{{modelpath}}'): unknown placeholder {{modelpath}}" in r.stderr
    ), r.stderr
    assert "(did you mean 'model_path'?)" in r.stderr and not (tmp_path / "runs").exists()


def test_a_server_that_exits_at_once_fails_its_configuration_with_its_log(tmp_path):
    cmd = '["{python}", "-c", "import sys; print(\'error: unrecognized arguments: --frobnicate\'); sys.exit(2)"]'
    exp = generic_experiment(tmp_path, name="exits", command=cmd)
    rc, out, run_dir = run_to_end(tmp_path, exp, timeout_s=180)
    assert rc == 2, out[-3000:]  # could not run: no point measured (servesweep.exit_codes)
    m = manifest(run_dir)
    (c,) = m["configs"].values()
    assert c["status"] == "failed"
    assert c["error"].startswith("error: unrecognized arguments: --frobnicate -- "), c["error"][:300]  # first
    assert "the server process exited before /health answered 200" in c["error"], c["error"]
    assert "unrecognized arguments: --frobnicate" in c["error"], c["error"]  # the log's tail
    assert all(p["status"] == "server_failed" for p in m["points"].values())


@pytest.mark.fast
def test_the_plan_of_a_generic_server_skips_sglang_arithmetic_and_says_so():
    text = textwrap.dedent(
        """\
        name: tf
        target: {inventory: local}
        model: {path: /tmp/work/model}
        launcher:
          command: ["{python}", "-m", "transformers", "serve", "{model_path}", "--host", "{host}", "--port",
                    "{port}", "--continuous-batching"]
        server:
          base: {cb_max_batch_tokens: 8192}
          axes: {cb_use_cuda_graph: [true, false]}
        load: {concurrency: [1, 64], prompt_tokens: [3k, 100k], output_tokens: [256], requests: 64}
        """
    )
    exp = parse_experiment(text)  # no sglang_version, flags that SGLang does not know
    assert (
        exp.sglang_version is None and exp.launcher.verify is False and exp.launcher.flush_cache_path is None
    )
    assert exp.launcher.health_path == "/health" and exp.launcher.info_paths == {}
    # what --resume reads back from the manifest is the same experiment (the kind-dependent defaults included)
    again = Experiment.model_validate(exp.model_dump(mode="json"))
    assert again == exp and again.launcher.flush_cache_path is None and again.digest() == exp.digest()
    plan = plan_json(make_plan(exp))
    assert plan["points_feasible"] == 8 and plan["points_infeasible"] == 0  # no memory arithmetic drops 100k
    assert [p["code"] for p in plan["pitfalls"]] == [GENERIC_UNPLANNED]
    assert "does not plan its memory" in plan["pitfalls"][0]["message"]
    # an SGLang experiment still needs its version
    try:
        parse_experiment(text.replace("  command:", "  kind: process\n  x_command:"), "e.yaml")
    except ExperimentError as e:
        assert "unknown key 'x_command'" in str(e)
    else:
        raise AssertionError("an unknown launcher key was accepted")
    sglang = (
        text.split("launcher:")[0]
        + "load: {concurrency: [1], prompt_tokens: [8], output_tokens: [8], requests: 1}\n"
    )
    try:
        parse_experiment(sglang, "e.yaml")
    except ExperimentError as e:
        assert "sglang_version: required key is missing" in str(e)
    else:
        raise AssertionError("an SGLang experiment without sglang_version was accepted")
    # SGLang keeps its defaults, through the manifest too
    sg = parse_experiment("sglang_version: 0.5.23\n" + sglang)
    assert sg.launcher.flush_cache_path == "/flush_cache" and sg.launcher.verify is True
    assert sg.launcher.info_paths == {
        "model_info": "/model_info",
        "server_info": "/server_info",
        "models": "/v1/models",
    }
    assert Experiment.model_validate(sg.model_dump(mode="json")).launcher.flush_cache_path == "/flush_cache"
