"""The planner against hand-computed cases (Qwen3.6-27B: 64 layers, 16 of them full attention, 4 KV heads of
dimension 256, 24 attention heads, 26.9 B parameters in bf16, 262144 positions)."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from servesweep.cli.plan import command
from servesweep.config.experiment import parse_experiment
from servesweep.matrix.planner import make_plan, plan_json

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

PARAMS = 26_895_319_040  # Qwen3.6-27B, counted from its config (embeddings + 64 layers + LM head)


def _plan(body: str) -> dict:
    head = textwrap.dedent(
        """\
        name: t
        sglang_version: 0.5.23
        target: {inventory: local}
        model: {path: Qwen/Qwen3.6-27B}
        """
    )
    return plan_json(make_plan(parse_experiment(head + textwrap.dedent(body))))


def _cfg(plan: dict, prefix: str) -> dict:
    return next(c for c in plan["configs"] if c["id"].startswith(prefix))


def test_one_48gb_gpu_cannot_hold_the_weights_and_tp2_fits_100k():
    plan = _plan(
        """\
        launcher: {emulator: true, gpu: RTX A6000, gpus_per_host: 2}
        server:
          base: {context_length: 131072}
          axes: {tp_size: [1, 2]}
        load: {concurrency: [1, 2, 4], prompt_tokens: [100k], output_tokens: 500, requests: 2}
        """
    )
    tp1, tp2 = _cfg(plan, "s01"), _cfg(plan, "s02")
    # 26.9 B params × 2 bytes = 50.1 GiB of weights > the 48 GiB of one RTX A6000: SGLang cannot start.
    assert round(PARAMS * 2 / 2**30, 1) == 50.1
    assert not tp1["feasible"] and "Not enough memory" in tp1["error"] and "50.1" in tp1["error"]
    assert all(not p["feasible"] and "server configuration" in p["reasons"][0] for p in tp1["points"])
    # TP2: KV per token per GPU = 16 full-attention layers × (K, V) × 4/2 heads × 256 dims × 2 bytes = 32 KiB.
    assert tp2["feasible"]
    assert tp2["facts"]["kv_bytes_per_token_per_gpu"] == 16 * 2 * 2 * 256 * 2 == 32768
    assert tp2["facts"]["hybrid"] and tp2["facts"]["state_slots"] > 0
    cap = tp2["facts"]["kv_capacity_tokens"]
    # the KV pool is what is left after weights (12.5 GiB) and the GDN state slots: about 8 GiB of KV
    assert 200_000 < cap < 300_000
    fit = cap // 100_500
    for p in tp2["points"]:
        assert p["feasible"] == (p["concurrency"] <= fit), p
        if not p["feasible"]:
            assert f"at most {fit} requests of this size fit" in p["reasons"][0]


def test_tp8_replicates_the_4_kv_heads_and_context_pitfalls():
    plan = _plan(
        """\
        launcher: {emulator: true, gpu: RTX PRO 6000 Blackwell, gpus_per_host: 8}
        server:
          base: {context_length: 32768}
          axes: {tp_size: [4, 8]}
        load: {concurrency: [1], prompt_tokens: [3k, 60k, 100k], output_tokens: 1024, requests: 2}
        """
    )
    tp4, tp8 = _cfg(plan, "s01"), _cfg(plan, "s02")
    # 16 × 2 × max(1, 4 // tp) × 256 × 2: 16 KiB at tp 4 and still 16 KiB at tp 8 (heads replicate)
    assert tp4["facts"]["kv_bytes_per_token_per_gpu"] == tp8["facts"]["kv_bytes_per_token_per_gpu"] == 16384
    assert tp4["facts"]["kv_heads_per_gpu"] == tp8["facts"]["kv_heads_per_gpu"] == 1
    assert any("exceeds the model's 4 KV heads" in w for w in tp8["warnings"])
    assert not any("KV heads" in w for w in tp4["warnings"])
    for cfg in (tp4, tp8):
        by_prompt = {p["prompt_tokens"]: p for p in cfg["points"]}
        assert by_prompt[3000]["feasible"]
        for n in (60000, 100000):
            reason = by_prompt[n]["reasons"][0]
            assert f"prompt {n} + output 1024 = {n + 1024} ≥ context length 32768" in reason
            assert "set context_length to 131072 (covers the largest point, 101024 tokens)" in reason
            assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in reason  # 131072 ≤ 262144


def test_context_above_model_maximum_needs_the_override_and_tp_must_divide_heads():
    body = """\
        launcher: {emulator: true, gpu: H200, gpus_per_host: 8}
        server:
          base: {context_length: 400k}
          axes: {tp_size: [5, 8]}
        load: {concurrency: [1], prompt_tokens: [3k], output_tokens: 16, requests: 1}
        """
    plan = _plan(body)
    tp5, tp8 = _cfg(plan, "s01"), _cfg(plan, "s02")
    assert "tp_size 5 does not divide the model's 24 attention heads" in tp5["error"]
    assert "above the model's maximum 262144" in tp8["error"]
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in tp8["error"]
    body = textwrap.dedent(body).replace(
        "axes: {tp_size: [5, 8]}",
        "axes: {tp_size: [8]}\n  env: {SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: 1}",
    )
    plan = _plan(body)
    assert plan["configs"][0]["feasible"] and plan["configs"][0]["facts"]["context_len"] == 400_000


def test_speculative_reset_to_48_caps_the_concurrency_sweep():
    plan = _plan(
        """\
        launcher: {emulator: true, gpu: RTX PRO 6000 Blackwell, gpus_per_host: 8}
        server:
          base: {tp_size: 4, context_length: 32768}
          bundles:
            - name: mtp
              flags: {speculative_algorithm: NEXTN, speculative_num_steps: 3}
            - name: mtp-pinned
              flags: {speculative_algorithm: NEXTN, speculative_num_steps: 3, max_running_requests: 64}
        load: {concurrency: [1, 32, 64, 100], prompt_tokens: [1000], output_tokens: 500, requests: 2}
        """
    )
    mtp, pinned = _cfg(plan, "s01"), _cfg(plan, "s02")
    assert mtp["facts"]["max_running_requests"] == 48
    msg = next(w for w in mtp["warnings"] if "resets max_running_requests to 48" in w)
    assert "concurrency 64, 100 will queue" in msg
    queued = {
        p["concurrency"]
        for p in mtp["points"]
        if any("(speculative decoding's reset to 48)" in w for w in p["warnings"])
    }
    assert queued == {64, 100}
    assert pinned["facts"]["max_running_requests"] == 64
    assert not any("48" in w for w in pinned["warnings"])


def test_time_estimates_flag_multi_minute_prefill_and_the_budget():
    plan = _plan(
        """\
        launcher: {emulator: true, gpu: RTX PRO 6000 Blackwell, gpus_per_host: 8}
        server:
          base: {context_length: 131072}
          axes: {tp_size: [1, 8]}
        load: {concurrency: [1, 2], prompt_tokens: [3k, 120k], output_tokens: 256, requests: 4}
        budget: {wall_time: 5m}
        """
    )
    tp1, tp8 = _cfg(plan, "s01"), _cfg(plan, "s02")

    def pick(cfg, prompt, conc):
        return next(p for p in cfg["points"] if p["prompt_tokens"] == prompt and p["concurrency"] == conc)

    p100_tp1, p100_tp8, p3_tp1 = pick(tp1, 120_000, 1), pick(tp8, 120_000, 1), pick(tp1, 3000, 1)
    # 120k tokens × 2 × 26.9 B params ≈ 6.5 PFLOP (+ attention) on one 252 TFLOP/s GPU: tens of seconds
    assert p100_tp1["estimate"]["prefill_s"] > 20
    assert any(w.startswith("prefill of 120000 tokens takes") for w in p100_tp1["warnings"])
    c4 = pick(tp1, 120_000, 2)
    assert any(
        "the last of 2 concurrent prompts waits" in w and "multi-minute TTFT" in w for w in c4["warnings"]
    )
    assert p100_tp8["estimate"]["prefill_s"] < p100_tp1["estimate"]["prefill_s"] / 3
    assert p3_tp1["estimate"]["prefill_s"] < p100_tp1["estimate"]["prefill_s"] / 20
    assert p100_tp1["est_s"] > 4 * p100_tp1["estimate"]["prefill_s"]  # 4 requests, one at a time
    assert plan["total_s"] > plan["budget_s"] and not plan["within_budget"]
    # the most expensive points go first: the long prompts on one GPU
    assert set(plan["cut_first"][:2]) == {p100_tp1["id"], c4["id"]}
    # restarts: one per configuration, ordered so identical launches are neighbours
    assert plan["restarts"] == 2


def test_identical_launches_need_no_restart():
    plan = _plan(
        """\
        launcher: {emulator: true, gpu: H200}
        server:
          axes: {tp_size: [1, 2]}
          bundles: [{name: a}, {name: b}]
        load: {concurrency: [1], prompt_tokens: [100], output_tokens: 8, requests: 1}
        """
    )
    order = [(c["id"], c["restart"]) for c in plan["configs"]]
    # a and b launch the same server: the planner makes them neighbours and skips the restart
    assert order == [("s01-tp1-a", True), ("s02-tp1-b", False), ("s03-tp2-a", True), ("s04-tp2-b", False)]
    assert plan["restarts"] == 2


def test_plan_command_json_and_table(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text(
        "name: t\nsglang_version: 0.5.23\ntarget: {inventory: local}\nmodel: {path: Qwen/Qwen3.6-27B}\n"
        "launcher: {emulator: true, gpu: H200}\nserver: {base: {context_length: 4096}}\n"
        "load: {concurrency: [1, 2], prompt_tokens: [1000, 8000], output_tokens: 16, requests: 2}\n"
    )
    r = CliRunner().invoke(command, [str(f), "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert (j["points_total"], j["points_feasible"], j["points_infeasible"]) == (4, 2, 2)
    r = CliRunner().invoke(command, [str(f)])
    assert r.exit_code == 0 and "dropped points (2)" in r.output and "≥ context length 4096" in r.output
    f.write_text(f.read_text().replace("requests: 2", "requests: two"))
    r = CliRunner().invoke(command, [str(f)])
    assert r.exit_code == 2 and "e.yaml:7: load.requests: expected an integer, got 'two'" in r.output


def test_field_examples_report_their_pitfalls():
    from pathlib import Path

    from servesweep.config.experiment import load_experiment

    ex = Path(__file__).resolve().parents[2] / "examples"
    a6000 = plan_json(make_plan(load_experiment(ex / "qwen36-27b-a6000-tp2.yaml")))
    (cfg,) = a6000["configs"]
    dropped = [p for p in cfg["points"] if not p["feasible"]]
    assert {p["prompt_tokens"] for p in dropped} == {60000, 100000}
    assert all("set context_length to 131072" in p["reasons"][0] for p in dropped)
    assert any("resets max_running_requests to 48 because it is not set" in w for w in cfg["warnings"])
    assert cfg["facts"]["hybrid"] and cfg["facts"]["kv_bytes_per_token_per_gpu"] == 32768
    pro = plan_json(make_plan(load_experiment(ex / "qwen36-27b-rtxpro6000.yaml")))
    tp8 = [c for c in pro["configs"] if c["flags"]["tp_size"] == 8]
    assert tp8 and all(any("exceeds the model's 4 KV heads" in w for w in c["warnings"]) for c in tp8)
    assert not pro["within_budget"] and pro["cut_first"]
    ddtree = [c for c in pro["configs"] if c["bundle"].startswith("ddtree") and c["feasible"]]
    assert ddtree and all(c["facts"]["spec_algorithm"] == "DDTREE" for c in ddtree)


def test_points_past_the_kv_pool_are_kept_on_purpose_and_labelled(tmp_path):
    """keep: [kv_overflow]: a point whose running requests × context exceed the KV pool runs (instead of being
    dropped), labelled in plan --json (kept, its pitfall with the pool), the printed plan and the point's warnings
    (the manifest's, which the report badges); a point one request of which does not fit is still dropped."""
    body = """\
        launcher: {emulator: true, gpu: RTX A6000, gpus_per_host: 2}
        server: {base: {context_length: 131072, tp_size: 2}}
        load: {concurrency: [1, 2, 4], prompt_tokens: [100k], output_tokens: 500, requests: 2}
        """
    (cfg,) = _plan(body)["configs"]
    pool = cfg["facts"]["kv_capacity_tokens"]
    fit = pool // 100_500
    assert fit == 2 and [p["feasible"] for p in cfg["points"]] == [True, True, False]
    plan = _plan(body + "keep: [kv_overflow]\n")
    (cfg,) = plan["configs"]
    c4 = cfg["points"][2]
    assert c4["feasible"] and c4["kept"] == ["kv_overflow"] and c4["pitfalls"][0] == "kv_overflow"
    assert c4["warnings"][0] == (
        f"kv_overflow: kept past the KV pool on purpose (keep kv_overflow); KV capacity {pool} tokens < 4 running × "
        "100500 "
        "tokens: at most 2 requests of this size fit, the rest would queue or be retracted"
    )
    assert [p["kept"] for p in cfg["points"][:2]] == [[], []] and plan["points_feasible"] == 3
    (pf,) = [p for p in plan["pitfalls"] if p["code"] == "kv_overflow"]
    assert pf["points"] == [c4["id"]] and f"pool {cfg['id']}: {pool:,} tokens" in pf["message"]
    assert c4["estimate"]["request_s"] > 0  # priced at the 2 that fit at once
    f = tmp_path / "e.yaml"
    head = "name: t\nsglang_version: 0.5.23\ntarget: {inventory: local}\nmodel: {path: Qwen/Qwen3.6-27B}\n"
    f.write_text(head + textwrap.dedent(body) + "keep: [kv_overflow]\n")
    r = CliRunner(env={"COLUMNS": "250"}).invoke(command, [str(f)])
    assert r.exit_code == 0, r.output
    assert (
        "points kept past the KV pool on purpose (1, keep kv_overflow)" in r.output and c4["id"] in r.output
    )
    assert "KV capacity 266317 tokens < 4 running × 100500 tokens" in r.output
    assert "dropped points" not in r.output
    # one request larger than the pool is not kept: it cannot run at all
    small = body.replace("prompt_tokens: [100k]", f"prompt_tokens: [{pool}]")
    (cfg,) = _plan(small + "keep: [kv_overflow]\n")["configs"]
    assert not any(p["feasible"] for p in cfg["points"])
    # an unknown value is an error naming the file and line
    f.write_text(head + textwrap.dedent(body) + "keep:\n  - kv_overflw\n")
    r = CliRunner().invoke(command, [str(f)])
    assert (
        r.exit_code == 2
        and "e.yaml:8: keep: unknown keep 'kv_overflw' (did you mean 'kv_overflow'?)" in r.output
    )
