"""SGLang's memory arithmetic against hand-computed cases (reference sglang.md §1, §4, §7)."""

from __future__ import annotations

import json

import pytest

from servesweep.sglang.gpus import get_gpu
from servesweep.sglang.memory import auto_mem_fraction_static, kv_bytes_per_token, state_slot_bytes
from servesweep.sglang.models import MODEL_PROFILES, load_model_arch
from servesweep.sglang.serverargs import resolve_server

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_qwen36_27b_shape_and_kv_replication_at_tp8():
    a = load_model_arch("Qwen/Qwen3.6-27B")
    assert (a.num_layers, a.full_attention_layers, a.num_kv_heads, a.head_dim) == (64, 16, 4, 256)
    assert [i for i in range(8) if a.layer_is_full_attention(i)] == [3, 7]
    assert 26e9 < a.total_params < 28.5e9
    # 16 full-attention layers x K,V x heads per rank x 256 x 2 bytes; TP8 > 4 KV heads: one head per rank.
    assert kv_bytes_per_token(a, 1) == 16 * 2 * 4 * 256 * 2 == 64 * KiB
    assert kv_bytes_per_token(a, 2) == 32 * KiB
    assert kv_bytes_per_token(a, 4) == 16 * KiB
    assert kv_bytes_per_token(a, 8) == 16 * KiB  # replicated: no longer shrinks with TP
    # GDN state slot at TP1: 48 linear layers x (conv (48*128 + 2*16*128) x 3 x bf16 + ssm 48 x 128 x 128 x fp32)
    assert state_slot_bytes(a, 1) == 48 * ((48 * 128 + 2 * 16 * 128) * 3 * 2 + 48 * 128 * 128 * 4)


def test_reference_table_of_hybrid_models():
    """reference §7 table: Qwen3-Next-80B-A3B and Qwen3.5/3.6-35B-A3B."""
    nxt = load_model_arch("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert (nxt.num_layers, nxt.full_attention_layers) == (48, 12)
    assert kv_bytes_per_token(nxt, 1) == 24 * KiB and kv_bytes_per_token(nxt, 2) == 12 * KiB
    assert kv_bytes_per_token(nxt, 4) == 12 * KiB  # 2 KV heads replicate beyond TP2
    assert round(state_slot_bytes(nxt, 1) / MiB, 1) == 73.7
    assert round(state_slot_bytes(nxt, 1, "bfloat16") / MiB, 1) == 37.7
    assert round(100_000 * kv_bytes_per_token(nxt, 1) / GiB, 2) == 2.29

    moe = load_model_arch("Qwen/Qwen3.6-35B-A3B")
    assert (moe.num_layers, moe.full_attention_layers, moe.num_kv_heads) == (40, 10, 2)
    assert kv_bytes_per_token(moe, 1) == 20 * KiB and kv_bytes_per_token(moe, 2) == 10 * KiB
    assert round(state_slot_bytes(moe, 1) / MiB, 1) == 61.4
    assert round(state_slot_bytes(moe, 1, "bfloat16") / MiB, 1) == 31.4
    assert round(100_000 * kv_bytes_per_token(moe, 1) / GiB, 2) == 1.91
    assert moe.is_moe and 3e9 < moe.active_params < 4e9 and 33e9 < moe.total_params < 37e9


def test_llama_kv_bytes():
    a8 = load_model_arch("meta-llama/Llama-3.1-8B-Instruct")
    assert kv_bytes_per_token(a8, 1) == 128 * KiB
    assert kv_bytes_per_token(a8, 1, "fp8_e4m3") == 64 * KiB
    assert kv_bytes_per_token(load_model_arch("meta-llama/Llama-3.1-70B"), 1) == 320 * KiB
    assert 7.9e9 < a8.total_params < 8.1e9


def test_config_json_with_text_config_nesting(tmp_path):
    cfg = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "num_hidden_layers": 8,
            "layer_types": ["linear_attention"] * 3
            + ["full_attention"]
            + ["linear_attention"] * 3
            + ["full_attention"],
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "vocab_size": 1000,
            "intermediate_size": 2048,
            "max_position_embeddings": 32768,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = load_model_arch(tmp_path)
    assert (a.num_layers, a.full_attention_layers, a.max_position_embeddings) == (8, 2, 32768)
    assert kv_bytes_per_token(a, 1) == 2 * 2 * 2 * 128 * 2
    assert state_slot_bytes(a, 1) == 6 * ((8 * 64 + 2 * 4 * 64) * 3 * 2 + 8 * 64 * 64 * 4)
    r = resolve_server({"model_path": str(tmp_path), "sim_gpu": "H100"})
    assert r.context_len == 32768 and r.is_hybrid and r.state_slots > 0


def test_unknown_model_and_gpu_errors_name_the_choices():
    with pytest.raises(ValueError) as e:
        load_model_arch("acme/NoSuchModel-7B")
    assert (
        "NoSuchModel-7B" in str(e.value) and "Qwen3.6-27B" in str(e.value) and "config.json" in str(e.value)
    )
    with pytest.raises(ValueError) as e:
        get_gpu("B300")
    assert "B300" in str(e.value) and "H200" in str(e.value) and "RTX A6000" in str(e.value)
    assert get_gpu("nvidia-h200").name == "H200"
    assert get_gpu("rtx-pro-6000").memory_mib > 90 * 1024
    assert get_gpu("A6000").name == "RTX A6000"
    assert set(MODEL_PROFILES) >= {"Qwen3.6-27B", "Qwen3.6-35B-A3B", "Llama-3.1-8B", "Llama-3.1-70B"}


def test_auto_mem_fraction_and_kv_pool_llama8b_h100():
    # reserved = 512 + 1.5*8192 + 1*1/8*1024 + 256*2 = 13440 MiB on an 81559 MiB H100.
    assert auto_mem_fraction_static(81559, 8192, 1, 256) == round((81559 - 13440) / 81559, 3) == 0.835
    assert auto_mem_fraction_static(143771, 8192, 1, 256) == 0.907  # "about 0.90-0.91 on an H200 at TP1"
    r = resolve_server({"model_path": "meta-llama/Llama-3.1-8B-Instruct", "sim_gpu": "h100"})
    assert r.mem_fraction_static == 0.835 and r.chunked_prefill_size == 8192
    # rest = frac * (free before weights) - weights; tokens = rest / 128 KiB
    free_gib = 81559 / 1024 - 0.5
    rest = 0.835 * free_gib * GiB - r.arch.total_params * 2
    assert r.max_total_num_tokens == int(rest // (128 * KiB))
    # auto max_running_requests = clamp(tokens/context*512, 2048, 4096), <= tokens/2
    assert r.effective_max_running_requests == 2048
    assert r.max_req_input_len == min(r.context_len - 1, r.max_total_num_tokens - 1) - 5
    assert any(
        line.startswith(f"max_total_num_tokens={r.max_total_num_tokens}, chunked_prefill_size=8192")
        for line in r.log_lines
    )


def test_spec_resets_max_running_requests_to_48_unless_set():
    args = {
        "model_path": "meta-llama/Llama-3.1-8B-Instruct",
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "someone/EAGLE3-draft",
    }
    r = resolve_server(args)
    assert r.effective_max_running_requests == 48 and r.args["max_running_requests"] == 48
    assert any("Max running requests is reset to 48 for speculative decoding" in line for line in r.log_lines)
    assert (r.spec_num_steps, r.spec_eagle_topk, r.spec_num_draft_tokens) == (5, 4, 8)  # Llama defaults
    assert r.num_reserved_tokens == max(4 * 5, 8)
    r2 = resolve_server({**args, "max_running_requests": 128})
    assert r2.effective_max_running_requests == 128
    assert not any("reset to 48" in line for line in r2.log_lines)


def test_nextn_is_eagle_with_qwen_defaults_and_hybrid_cap():
    r = resolve_server(
        {
            "model_path": "Qwen/Qwen3.6-27B",
            "tp_size": 2,
            "sim_gpu": "RTX A6000",
            "speculative_algorithm": "nextn",
        }
    )
    assert r.spec_algorithm == "EAGLE" and r.args["speculative_algorithm"] == "EAGLE"
    assert (r.spec_num_steps, r.spec_eagle_topk, r.spec_num_draft_tokens) == (3, 1, 4)
    assert r.mamba_radix_cache_strategy == "extra_buffer"
    # state slots cap running requests: slots // (3 + 2) with extra_buffer and overlap.
    assert r.effective_max_running_requests == min(48, r.state_slots // 5) < 48
    steps5 = resolve_server(
        {"model_path": "Qwen/Qwen3.6-27B", "speculative_algorithm": "NEXTN", "speculative_num_steps": 5}
    )
    assert steps5.spec_num_draft_tokens == 6  # topk 1 forces draft = steps + 1


def test_unknown_spec_algorithm_and_forked_extra():
    with pytest.raises(ValueError, match=r"^Unknown speculative algorithm name: DDTREE$"):
        resolve_server({"model_path": "Qwen/Qwen3.6-27B", "speculative_algorithm": "DDTREE"})
    r = resolve_server(
        {
            "model_path": "Qwen/Qwen3.6-27B",
            "speculative_algorithm": "DDTREE",
            "speculative_num_draft_tokens": 32,
        },
        extra_spec_algorithms={"DDTREE"},
    )
    assert (
        r.spec_algorithm == "DDTREE"
        and r.spec_num_draft_tokens == 32
        and r.effective_max_running_requests <= 48
    )


def test_context_length_override_rule():
    args = {"model_path": "Qwen/Qwen3.6-27B", "context_length": 300_000}
    with pytest.raises(ValueError) as e:
        resolve_server(args)
    assert str(e.value) == (
        "Warning: User-specified context_length (300000) is greater than the derived context_length (262144). "
        "This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ "
        "from max_position_embeddings in the model's config. To allow overriding this maximum, set the env var "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
    )
    r = resolve_server(args, {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"})
    assert r.context_len == 300_000
    assert resolve_server({"model_path": "Qwen/Qwen3.6-27B", "context_length": 32768}).context_len == 32768


def test_old_versions_reject_spec_with_no_buffer_radix():
    args = {
        "model_path": "Qwen/Qwen3.6-27B",
        "tp_size": 2,
        "sim_gpu": "a6000",
        "speculative_algorithm": "NEXTN",
        "sim_sglang_version": "0.5.11",
    }
    with pytest.raises(
        ValueError, match="use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1"
    ):
        resolve_server(args)
    r = resolve_server({**args, "mamba_scheduler_strategy": "extra_buffer"})
    assert r.mamba_radix_cache_strategy == "extra_buffer"


def test_tp_scaling_of_kv_capacity_stops_at_kv_heads():
    """Per-GPU KV capacity grows with TP until TP exceeds the 4 KV heads (weights keep shrinking)."""
    caps = {
        tp: resolve_server(
            {
                "model_path": "Qwen/Qwen3.6-27B",
                "tp_size": tp,
                "sim_gpu": "rtx-pro-6000",
                "max_running_requests": 64,
            }
        )
        for tp in (1, 2, 4, 8)
    }
    assert caps[1].max_total_num_tokens < caps[2].max_total_num_tokens < caps[4].max_total_num_tokens
    assert caps[4].kv_bytes_per_token == caps[8].kv_bytes_per_token
    # TP8 gains only the memory freed by smaller weight shards, not the halved KV bytes of TP4
    assert caps[8].max_total_num_tokens < 1.5 * caps[4].max_total_num_tokens


def test_bad_tp_and_too_big_model():
    with pytest.raises(ValueError, match="divisible by tensor parallel size"):
        resolve_server({"model_path": "Qwen/Qwen3.6-27B", "tp_size": 5})
    with pytest.raises(RuntimeError, match="Not enough memory"):
        resolve_server({"model_path": "meta-llama/Llama-3.1-70B", "sim_gpu": "a6000"})


def test_spec_v2_variable_is_a_no_op_notice_from_0_5_15_on():
    args = {
        "model_path": "Qwen/Qwen3.6-27B",
        "tp_size": 2,
        "sim_gpu": "RTX A6000",
        "speculative_algorithm": "NEXTN",
    }
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    new = resolve_server({**args, "sim_sglang_version": "0.5.23"}, env)
    old = resolve_server(
        {**args, "sim_sglang_version": "0.5.11", "mamba_scheduler_strategy": "extra_buffer"}, env
    )
    assert any("SGLANG_ENABLE_SPEC_V2 has been removed" in w for w in new.warnings)
    assert not any("SGLANG_ENABLE_SPEC_V2" in w for w in old.warnings)
