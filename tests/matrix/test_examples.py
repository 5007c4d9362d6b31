"""The shipped field matrices (examples/): plan reports each pitfall of issue 13 unprompted, the role renders the
named SGLang version's flag names, and both examples run end to end on the emulator as shrunk dry runs.

Hand arithmetic (Qwen3.6-27B config.json: 64 layers, every 4th full attention, 4 KV heads × 256 dims; Gated
DeltaNet 48 value / 16 key heads × 128 dims, conv kernel 4, mamba_ssm_dtype float32):
- KV per token per GPU = 16 full layers × 2 (K, V) × max(1, 4 / tp) heads × 256 × 2 bytes: 64 KiB at tp 1,
  32 KiB at tp 2, 16 KiB at tp 4 and (replicated) still 16 KiB at tp 8.
- one state slot per GPU = 48 GDN layers × (conv (48·128 + 2·16·128)/tp × 3 × 2 bytes + SSM 48/tp × 128 × 128 × 4
  bytes) = 76,972,032 bytes (73.4 MiB) at tp 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from support import run_servesweep, with_server_argv

from servesweep.cli.plan import command as plan_command
from servesweep.config.experiment import parse_experiment
from servesweep.driver.ansible import local_inventory, run_playbook
from servesweep.sglang.gpus import GPU_PROFILES
from servesweep.sglang.models import dflash_draft_params, load_model_arch
from servesweep.sglang.serverargs import resolve_server

ROOT = Path(__file__).resolve().parents[2]
A6000 = ROOT / "examples" / "qwen36-27b-a6000-tp2.yaml"
RTX = ROOT / "examples" / "qwen36-27b-rtxpro6000.yaml"
SLOT_TP2 = 48 * ((48 * 128 + 2 * 16 * 128) // 2 * 3 * 2 + 48 // 2 * 128 * 128 * 4)


def _plan(path: Path) -> dict:
    r = CliRunner().invoke(plan_command, [str(path), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _pitfall(plan: dict, code: str) -> dict:
    found = [p for p in plan["pitfalls"] if p["code"] == code]
    assert found, f"plan does not report {code}: {[p['code'] for p in plan['pitfalls']]}"
    return found[0]


def _points(plan: dict) -> dict[str, dict]:
    return {p["id"]: p for c in plan["configs"] for p in c["points"]}


@pytest.mark.fast
def test_a6000_plan_reports_context_memory_spec_reset_and_long_prefill():
    plan = _plan(A6000)
    pts = _points(plan)
    ctx = _pitfall(plan, "context_length_too_short")
    # 60k/100k prompts + 500 outputs (+ 4 reserved draft tokens) do not fit 32768; 100504 → next power of two 131072,
    # below the model's 262144, so no override variable
    assert ctx["detail"]["set_context_length"] == 131072 and ctx["detail"]["set_env"] == {}
    assert "set context_length to 131072" in ctx["message"]
    assert sorted({pts[i]["prompt_tokens"] for i in ctx["points"]}) == [60000, 100000]
    assert all(not pts[i]["feasible"] for i in ctx["points"])
    assert all(p["feasible"] for p in pts.values() if p["prompt_tokens"] <= 30000)

    mem = _pitfall(plan, "kv_state_memory")
    row = mem["detail"]["per_config"][0]
    assert mem["detail"]["hybrid"] and row["tp_size"] == 2
    assert row["kv_bytes_per_token_per_gpu"] == 16 * 2 * 2 * 256 * 2
    assert (
        round(row["state_slot_mib_per_gpu"] * 2**20) == SLOT_TP2
        or abs(row["state_slot_mib_per_gpu"] - SLOT_TP2 / 2**20) < 0.01
    )
    assert (
        0.8 < row["mem_fraction_static"] < 0.95 and row["kv_gib_per_gpu"] > 0 and row["state_gib_per_gpu"] > 0
    )
    mrr = row["max_running_requests"]
    assert mrr == 11  # the state slots, not the KV pool, bound the running requests (derivation below)
    # the 1000-token points above the state-slot cap queue; the long-context ones overflow the KV pool
    short = sorted(pts[i]["concurrency"] for i in mem["points"] if pts[i]["prompt_tokens"] == 1000)
    assert short == [16, 32, 64, 100]
    for i in mem["points"]:
        p = pts[i]
        assert (
            p["concurrency"] > mrr
            or min(p["concurrency"], mrr) * (p["prompt_tokens"] + 500) > row["kv_tokens"]
        )

    spec = _pitfall(plan, "spec_resets_max_running_requests")
    assert spec["detail"]["reset_to"] == 48 and "max_running_requests" in spec["message"]
    assert {pts[i]["concurrency"] for i in spec["points"]} == {16, 32, 64, 100}

    slow = _pitfall(plan, "multi_minute_prefill")
    assert slow["points"] and all(slow["detail"][i]["last_ttft_s"] >= 60 for i in slow["points"])
    # one 1000-token prefill is well under a second, but at concurrency 100 with 11 running, 9 more waves queue
    # before the last request starts: its first token comes minutes later
    assert "s01.chat-p1000-o500-c100" in slow["points"]
    assert slow["detail"]["s01.chat-p1000-o500-c100"]["prefill_s"] < 5
    assert "waves queue behind 11 running" in " ".join(pts["s01.chat-p1000-o500-c100"]["warnings"])
    # within the 2 h budget: no cut list
    assert plan["within_budget"] and not any(p["code"] == "over_budget" for p in plan["pitfalls"])


@pytest.mark.fast
def test_context_above_the_model_maximum_names_the_override_variable(tmp_path):
    d = yaml.safe_load(A6000.read_text())
    d["load"]["prompt_tokens"] = [1000, 300000]
    d["exclude"] = []
    f = tmp_path / "long.yaml"
    f.write_text(yaml.safe_dump(d))
    ctx = _pitfall(_plan(f), "context_length_too_short")
    assert ctx["detail"]["set_context_length"] == 524288
    assert ctx["detail"]["set_env"] == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in ctx["message"]


@pytest.mark.fast
def test_rtxpro_plan_reports_kv_head_replication_spec_reset_prefill_and_budget():
    plan = _plan(RTX)
    pts = _points(plan)
    by_id = {c["id"]: c for c in plan["configs"]}
    tp8 = _pitfall(plan, "tp_exceeds_kv_heads")
    assert tp8["configs"] and all(by_id[c]["flags"]["tp_size"] == 8 for c in tp8["configs"])
    per_tp = {int(k): v for k, v in tp8["detail"]["per_tp"].items()}
    assert per_tp[1]["kv_bytes_per_token_per_gpu"] == 64 * 1024
    assert per_tp[4]["kv_bytes_per_token_per_gpu"] == per_tp[8]["kv_bytes_per_token_per_gpu"] == 16 * 1024
    assert per_tp[8]["kv_heads_per_gpu"] == 1

    mem = _pitfall(plan, "kv_state_memory")
    assert {r["tp_size"] for r in mem["detail"]["per_config"]} == {1, 4, 8}
    # concurrency × context that does not fit: e.g. 4 × 100k prompts on TP1 (~277k tokens of KV)
    assert any(pts[i]["prompt_tokens"] == 100000 and not pts[i]["feasible"] for i in mem["points"])

    spec = _pitfall(plan, "spec_resets_max_running_requests")
    assert spec["configs"] and all(by_id[c]["bundle"] != "ar" for c in spec["configs"])
    assert {pts[i]["concurrency"] for i in spec["points"]} >= {64, 100}

    slow = _pitfall(plan, "multi_minute_prefill")
    tp1_100k = [i for i in slow["points"] if pts[i]["prompt_tokens"] == 100000 and i.split("-")[1] == "tp1"]
    assert tp1_100k, "100k prompts on TP1 are not flagged as multi-minute"
    for i in tp1_100k:
        d = slow["detail"][i]
        # a single 100k prefill on TP1 is tens of seconds; the wave of concurrent prompts makes it minutes
        assert 15 < d["prefill_s"] < d["last_ttft_s"] and d["last_ttft_s"] >= 60

    budget = _pitfall(plan, "over_budget")
    assert plan["budget_s"] == 7200 and plan["total_s"] > 7200
    cut = set(budget["points"])
    kept = sum(p["est_s"] for p in pts.values() if p["feasible"] and p["id"] not in cut)
    # the cut points sit mostly on TP1 and the 100k prompts: the axis values to trim first
    assert budget["detail"]["trim_first"]["prompt_tokens"][0] == "100000"
    assert budget["detail"]["trim_first"]["config"][0].split("-")[1] == "tp1"
    assert kept < plan["total_s"] and plan["total_s"] - sum(pts[i]["est_s"] for i in cut) <= 7200 + 1


@pytest.mark.fast
def test_dflash_draft_is_a_small_drafter_so_tp1_on_96gb_starts(tmp_path):
    """Defect: DFLASH at TP1 on an RTX PRO 6000 was refused "Not enough memory" (draft sized as the target)."""
    plan = _plan(RTX)
    tp1 = next(c for c in plan["configs"] if c["id"].endswith("tp1-dflash"))
    assert tp1["feasible"], tp1["error"]
    ar = next(c for c in plan["configs"] if c["id"].endswith("tp1-ar"))
    draft_gib = tp1["facts"]["memory_usage"]["weight"] - ar["facts"]["memory_usage"]["weight"]
    assert 1.0 < draft_gib < 6.0  # 5 layers of the target's width, embedding and LM head shared
    # a draft config.json decides the size when present
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DFlashDraftModel"],
                "num_hidden_layers": 2,
                "hidden_size": 5120,
                "intermediate_size": 17408,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 248320,
                "dflash_config": {"target_layer_ids": [1, 21, 41], "block_size": 16},
            }
        )
    )
    arch = load_model_arch("Qwen/Qwen3.6-27B")
    attn = 5120 * 32 * 128 + 2 * 5120 * 8 * 128 + 32 * 128 * 5120
    assert dflash_draft_params(arch, tmp_path) == 2 * (attn + 3 * 5120 * 17408) + 3 * 5120 * 5120


@pytest.mark.fast
def test_a6000_state_slot_cap_follows_the_documented_derivation():
    """Defect check: TP2 NEXTN on 2× A6000 resolves max_running_requests from the GDN state slots (sglang.md §7).

    slot = 73.4 MiB per GPU (above); the post-weight budget splits mamba : KV = 0.9 : 1; each running request holds
    r = 5 slots (3 + 2 for extra_buffer with overlap) plus D = 4 intermediate states for spec verify, so
    running = budget × 0.9/1.9 / (slot × (5 + 4)). 100 running requests would need 100 × 9 × 73.4 MiB = 64.5 GiB of
    state per GPU on a 48 GB card holding 25 GiB of weights: concurrency 100 queues at the server."""
    rs = resolve_server(
        {
            "model_path": "Qwen/Qwen3.6-27B",
            "tp_size": 2,
            "sim_gpu": "RTX A6000",
            "context_length": 32768,
            "speculative_algorithm": "NEXTN",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
            "mamba_scheduler_strategy": "extra_buffer",
            "sim_sglang_version": "0.5.11",
        },
        {"SGLANG_ENABLE_SPEC_V2": "1"},
    )
    assert rs.state_slot_bytes == SLOT_TP2 == 76_972_032
    assert rs.mamba_ratio == 5 and rs.spec_num_draft_tokens == 4
    rest = (rs.memory_usage["kvcache"] + rs.memory_usage["mamba"]) * 2**30  # what the split divided
    budget = rest * 0.9 / 1.9
    assert rs.effective_max_running_requests == math.floor(budget / (SLOT_TP2 * (5 + 4))) == 11
    assert 100 * 9 * SLOT_TP2 > GPU_PROFILES["RTX A6000"].memory_bytes - 25 * 2**30


# ---------------------------------------------------------------------------------------------------------------
# version-aware flags, rendered by the role (check mode: nothing is started)


def _role_vars(exp, cfg: dict, tmp: Path) -> dict:
    return with_server_argv({
        "sglang_server_state": "started",
        "sglang_server_launcher": "systemd",
        "sglang_server_version": exp.sglang_version,
        "sglang_server_model_path": exp.model.path,
        "sglang_server_flags": cfg["flags"],
        "sglang_server_env": cfg["env"],
        "sglang_server_port": 30000,
        "sglang_server_python": "/opt/sglang/bin/python",
        "sglang_server_emulator": False,
        "sglang_server_workdir": str(tmp / "work"),
        "sglang_server_unit_dir": str(tmp / "units"),
        "sglang_server_gather_facts": False,
    })


def _unit_text(tmp: Path, text: str, ident: str) -> str:
    exp = parse_experiment(text)
    cfg = _plan_from_text(text)["configs"][0]
    r = run_playbook(
        "sglang_server.yml",
        inventory=local_inventory(),
        extravars=_role_vars(exp, cfg, tmp),
        artifact_dir=tmp / "artifacts",
        ident=ident,
        check=True,
        diff=True,
        timeout_s=300,
    )
    assert r.ok, r.error()
    out = []
    for f in (r.artifact_dir / "job_events").glob("*.json"):
        ev = json.loads(f.read_text())
        data = ev.get("event_data") or {}
        if ev.get("event") == "runner_on_ok" and data.get("task") == "Write the systemd unit":
            diff = (data.get("res") or {}).get("diff") or []
            out += [str(d.get("after", "")) for d in (diff if isinstance(diff, list) else [diff])]
    assert out, "the role rendered no unit"
    assert not (tmp / "units").exists()  # check mode wrote nothing
    return "\n".join(out)


def _plan_from_text(text: str) -> dict:
    from servesweep.matrix.planner import make_plan, plan_json

    return plan_json(make_plan(parse_experiment(text)))


def test_a6000_example_renders_0511_flag_names_and_a_0523_variant_the_new_ones(tmp_path):
    text = A6000.read_text()
    old = _unit_text(tmp_path / "old", text, "v0511")
    new = _unit_text(
        tmp_path / "new", text.replace('sglang_version: "0.5.11"', 'sglang_version: "0.5.23"'), "v0523"
    )
    assert "--mamba-scheduler-strategy extra_buffer" in old and "radix-cache-strategy" not in old
    assert "SGLANG_ENABLE_SPEC_V2=1" in old  # exists up to 0.5.12
    assert "--mamba-radix-cache-strategy extra_buffer" in new and "mamba-scheduler" not in new
    assert "SGLANG_ENABLE_SPEC_V2" not in new  # removed after 0.5.12
    for t in (old, new):
        assert (
            "--speculative-algorithm NEXTN" in t and "--speculative-num-steps 3" in t and "--tp-size 2" in t
        )


# ---------------------------------------------------------------------------------------------------------------
# shrunk dry runs on the emulator: the whole pipeline (role restarts, verification, points, results, report)


def _dry_run(tmp: Path, src: Path, extra_exclude: list[dict]) -> tuple[dict, Path]:
    d = yaml.safe_load(src.read_text())
    d["exclude"] = list(d.get("exclude") or []) + extra_exclude
    f = tmp / src.name
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    out = tmp / "runs"
    rc, text = run_servesweep("run", str(f), "--dry-run", "--out", str(out), timeout=400, columns=200)
    assert rc == 0, text[-5000:]
    assert "dry run" in text.lower()
    run_dir = next(out.iterdir())
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["dry_run"] is True and m["status"] in ("done", "finished", "complete", "completed"), m["status"]
    report = (run_dir / "report.md").read_text()
    assert "DRY RUN" in report.splitlines()[2] or "**DRY RUN**" in report
    for pid, p in m["points"].items():
        assert p["status"] in ("done", "infeasible"), (pid, p["status"], p.get("reason"))
        if p["status"] == "done":
            req = json.loads((run_dir / p["dir"] / "summary.json").read_text())["requests"]
            assert req["ok"] == p["concurrency"] and req["failed"] == 0, (pid, req)
            assert (run_dir / p["dir"] / "summary.json").is_file()
    return m, run_dir


def test_a6000_dry_run_completes_on_the_emulator(tmp_path):
    m, run_dir = _dry_run(tmp_path, A6000, [{"prompt_tokens": 30000, "concurrency": [2, 4]}])
    done = sorted(
        (p["prompt_tokens"], p["concurrency"]) for p in m["points"].values() if p["status"] == "done"
    )
    # the dry run keeps every configuration, the smallest and largest prompt and output, and 4 concurrencies (the
    # ends and two between them on a log scale): enough for the configuration's saturation knee
    assert done == [(1000, 1), (1000, 4), (1000, 16), (1000, 100), (30000, 1)]
    # the dry run takes the ends of what would run: the 60k/100k points that do not fit are the planner's to report
    assert {p["status"] for p in m["points"].values()} == {"done"}
    from servesweep.matrix.planner import make_plan

    full = make_plan(parse_experiment(A6000.read_text()))
    dropped = {pp.point.prompt_tokens for cp in full.configs for pp in cp.points if not pp.feasible}
    assert dropped == {60000, 100000}
    info = json.loads((run_dir / "servers" / "s01" / "server_info.json").read_text())
    argv = info["argv"]
    # the emulator ran the named version's flags, on the matching GPU profile
    assert (
        argv[argv.index("--sim-sglang-version") + 1] == "0.5.11"
        and argv[argv.index("--sim-gpu") + 1] == "RTX A6000"
    )
    assert "--mamba-scheduler-strategy" in argv and "--mamba-radix-cache-strategy" not in argv
    log = (run_dir / "servers" / "s01" / "server.log").read_text()
    assert "max_running_requests is capped to 11 by the mamba state cache" in log
    # needle probes per configuration and prompt length, in the report beside the speed (3 per length)
    report = (run_dir / "report.md").read_text()
    assert "## Answers" in report
    assert "| s01 | 1000 | 3/3 | 100% | 0 |" in report and "| s01 | 30000 | 3/3 | 100% | 0 |" in report, report
    assert m["configs"]["s01"]["needle_accuracy"] == {"1000": 1.0, "30000": 1.0}
    for p in m["points"].values():
        s = json.loads((run_dir / p["dir"] / "summary.json").read_text())
        assert s["needle_accuracy"] == 1.0 and s["degenerate_rate"] == 0.0, p
    assert 'id="answers"' in (run_dir / "report.html").read_text()
    # a verdict per point and a knee per configuration (issue 32), as diagnose computes them from summary.json
    from servesweep.results.diagnosis import diagnose_all
    from servesweep.results.diagnosis import knees as sweep_knees

    summaries = [json.loads((run_dir / p["dir"] / "summary.json").read_text()) for p in m["points"].values()]
    section = report[report.index("### Diagnosis") :]
    for s, d in zip(summaries, diagnose_all(summaries), strict=True):
        assert f"| {d.line} |" in section, (s["point_id"], d.line)
    sweep = "- saturation, config s01, chat p1000 o128"  # a dry run with 4 loads: outputs up to 128 tokens
    knees = [line for line in section.splitlines() if line.startswith(sweep)]
    # the report's verdict on the sweep is the one diagnosis computes from the points' summary.json. Whether the
    # throughput bends here depends on this machine: the emulator and Locust share its 2 cores with the whole suite,
    # and client-bound small points flatten the curve (a CI run: "grows slowly throughout"). The knee's arithmetic
    # is tests/results/test_diagnosis.py's, on known curves.
    (knee,) = sweep_knees(summaries).values()
    assert knees == [f"{sweep}: {knee.text}"], section
    assert knee.text.startswith(("knee at concurrency ≈ ", "no knee up to 100: ")), knee.text


def test_rtxpro_dry_run_completes_on_the_emulator(tmp_path):
    """Every TP and every kind of speculative method (autoregressive at TP1, DFLASH at TP4, DDTREE of the forked
    build at TP8), one small and the largest concurrency each."""
    keep = {1: "ar", 4: "dflash", 8: "ddtree32"}
    bundles = ["ar", "dflash", "ddtree16", "ddtree32", "ddtree64"]
    rules = [{"tp_size": tp, "bundle": [b for b in bundles if b != k]} for tp, k in keep.items()]
    rules += [{"prompt_tokens": [30000, 100000]}, {"concurrency": [2, 4, 8, 16, 32, 64]}]
    rules += [
        {"workload": "agent"}
    ]  # the agentic workload's dry run is covered by tests/test_orchestrator.py
    m, run_dir = _dry_run(tmp_path, RTX, rules)
    done = {p["config_id"] for p in m["points"].values() if p["status"] == "done"}
    assert len(done) == 3 and len(m["points"]) == 6
    for cid in done:
        info = json.loads((run_dir / "servers" / cid / "server_info.json").read_text())
        argv = info["argv"]
        assert argv[argv.index("--sim-sglang-version") + 1] == "0.5.23"
        assert argv[argv.index("--sim-gpu") + 1] == "RTX PRO 6000 Blackwell"
        if cid.endswith("ddtree32"):
            assert argv[argv.index("--sim-extra-spec-algorithms") + 1] == "DDTREE"
            assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
        if cid.endswith("dflash"):
            assert "--speculative-draft-model-path" in argv


@pytest.mark.fast
def test_ddtree_of_the_forked_build_accepts_more_tokens_per_step_as_its_budget_grows():
    """The emulator takes DDTREE only when declared (--sim-extra-spec-algorithms) and draws accept lengths from the
    per-budget model: 16 → 4.4, 32 → 5.0, 64 → 5.5 tokens per verify step (docs/examples/qwen36-27b-rtxpro6000.md)."""
    from servesweep.sim.engine import Engine, EngineRequest

    measured = {}
    for budget, want in ((16, 4.4), (32, 5.0), (64, 5.5)):
        rs = resolve_server(
            {
                "model_path": "Qwen/Qwen3.6-27B",
                "tp_size": 8,
                "sim_gpu": "RTX PRO 6000 Blackwell",
                "speculative_algorithm": "DDTREE",
                "speculative_num_draft_tokens": budget,
            },
            extra_spec_algorithms={"DDTREE"},
        )
        eng = Engine(rs, seed=1)
        reqs = [
            EngineRequest(f"r{i}", list(range(1, 300)), 400, lambda *a: None, ignore_eos=True)
            for i in range(8)
        ]
        eng.run_simulated(reqs)
        assert all(r.completion_tokens == 400 for r in reqs)
        measured[budget] = eng.stats().spec_accept_length
        assert abs(measured[budget] - want) < 0.35, (budget, measured[budget])
    assert measured[16] < measured[32] < measured[64]
