"""SGLang's memory arithmetic per rank: KV bytes per token, the recurrent state slot of hybrid models, weights
(target and draft), and the defaults SGLang sizes from GPU memory (chunked prefill, CUDA graph batch,
mem_fraction_static).

Pure functions of a `ModelArch`, a GPU's memory and the parallel sizes; `serverargs.resolve_server` runs them in
SGLang's start-up order. Every formula names the SGLang source it follows (paths inside `python/sglang/`, version
0.5.23 unless noted); `docs/emulator.md` explains them.
"""

from __future__ import annotations

from typing import Any

from servesweep.sglang.models import DTYPE_BYTES, ModelArch, dflash_draft_params, load_model_arch

_KV_DTYPE_BYTES = {
    "auto": None,
    "bf16": 2,
    "bfloat16": 2,
    "fp8_e5m2": 1,
    "fp8_e4m3": 1,
    "mxfp8": 1,
    "nvfp4": 0.5,
    "fp4_mx_block16": 0.5,
}


def kv_heads_per_rank(arch: ModelArch, tp: int) -> int:
    """`max(1, kv_heads // tp)`: KV heads replicate once tp exceeds them (srt/configs/model_config.py::get_num_kv_heads)."""
    return max(1, arch.num_kv_heads // tp)


def kv_bytes_per_token(arch: ModelArch, tp: int = 1, kv_cache_dtype: str = "auto") -> float:
    """KV bytes per token per rank: full-attention layers x (K+V) x heads per rank x head_dim x dtype bytes.

    model_executor/pool_configurator.py::_compute_cell_size (non-MLA branch); only full-attention layers hold KV
    for hybrid GDN models (reference §7).
    """
    b = _KV_DTYPE_BYTES.get(kv_cache_dtype.lower())
    if kv_cache_dtype.lower() not in _KV_DTYPE_BYTES:
        raise ValueError(
            f"--kv-cache-dtype: unknown value {kv_cache_dtype!r}; choices: {', '.join(_KV_DTYPE_BYTES)}"
        )
    if b is None:
        b = 2  # auto = the model dtype; KV stays bf16 even for fp8 weights
    return arch.full_attention_layers * 2 * kv_heads_per_rank(arch, tp) * arch.head_dim * b


def state_slot_bytes(arch: ModelArch, tp: int = 1, ssm_dtype: str | None = None) -> int:
    """Recurrent state of one request for hybrid GDN models, per rank (configs/mamba_utils.py).

    Per linear layer: conv `(v_heads*v_dim + 2*k_heads*k_dim)/tp x (conv_k-1)` in bf16, plus SSM
    `v_heads/tp x v_dim x k_dim` in `mamba_ssm_dtype` (fp32 by default).
    """
    if not arch.is_hybrid:
        return 0
    ssm_b = DTYPE_BYTES.get((ssm_dtype or arch.mamba_ssm_dtype).lower(), 4)
    conv_dim = arch.linear_num_value_heads * arch.linear_value_head_dim + 2 * (
        arch.linear_num_key_heads * arch.linear_key_head_dim
    )
    conv = conv_dim // tp * (arch.linear_conv_kernel_dim - 1) * 2
    ssm = arch.linear_num_value_heads // tp * arch.linear_value_head_dim * arch.linear_key_head_dim * ssm_b
    return arch.linear_layers * (conv + ssm)


def weight_bytes_per_rank(arch: ModelArch, tp: int = 1) -> float:
    return arch.total_params * arch.weight_bytes / tp


def default_chunked_prefill_size(gpu_mem_mib: int) -> int:
    """srt/arg_groups/memory_hook.py: by GPU memory (MiB): <20G 2048; <35G 4096; <60G 4096; <90G 8192; <160G 8192; else 16384."""
    g = gpu_mem_mib / 1024
    if g < 20:
        return 2048
    if g < 60:
        return 4096
    if g < 160:
        return 8192
    return 16384


def default_cuda_graph_max_bs(gpu_mem_mib: int, tp: int) -> int:
    """memory_hook.py: <20G 8; <35G 48 (160 at tp>=4); <60G 32 (160 at tp>=4); <160G 256 (512 at tp>=4); else 512."""
    g = gpu_mem_mib / 1024
    if g < 20:
        return 8
    if g < 35:
        return 160 if tp >= 4 else 48
    if g < 60:
        return 160 if tp >= 4 else 32
    if g < 160:
        return 512 if tp >= 4 else 256
    return 512


def auto_mem_fraction_static(
    gpu_mem_mib: int, chunked_prefill_size: int, tp: int, cuda_graph_max_bs: int, pp: int = 1
) -> float:
    """server_args.py `_handle_gpu_memory_settings` (0.5.23: arg_groups/memory_hook.py), all terms in MiB:

    reserved = 512 + 1.5 * max(chunked_prefill, 2048) + tp*pp/8*1024 + cuda_graph_max_bs*2, floored at 10 GiB on
    GPUs with more than 60 GiB; mem_fraction_static = round((gpu_mem - reserved)/gpu_mem, 3).
    """
    reserved = 512 + 1.5 * max(chunked_prefill_size, 2048) + tp * pp / 8 * 1024 + cuda_graph_max_bs * 2
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def runtime_overhead_gib(tp: int) -> float:
    """GiB already in use before weights load: CUDA context (~0.5 GiB) plus NCCL buffers when tp > 1."""
    return 0.5 + (0.3 if tp > 1 else 0.0)


def calculate_mamba_ratio(radix: bool, strategy: str | None, no_overlap: bool) -> int:
    """kv_cache_configurator.py::_calculate_mamba_ratio: 1 without radix; 3, +2 (extra_buffer, overlap),
    +1 (extra_buffer_lazy, or extra_buffer without overlap)."""
    if not radix:
        return 1
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        if no_overlap:
            return 4
        return 4 if strategy == "extra_buffer_lazy" else 5
    return 3


def draft_weight_bytes_per_rank(spec: str | None, arch: ModelArch, draft_path: Any, tp: int) -> float:
    """Weights of the draft worker per rank.

    NEXTN/EAGLE without a draft path load the checkpoint's MTP layer(s) and share the target's embedding and
    LM head; DFLASH/DSPARK load a small drafter (`dflash_draft_params`); another external draft loads its own model
    (a built-in profile or a config.json when resolvable, else one decoder layer of the target's shape). NGRAM has
    no draft model.
    """
    if spec is None or spec == "NGRAM":
        return 0.0
    if spec in ("DFLASH", "DSPARK"):
        return dflash_draft_params(arch, draft_path) * arch.weight_bytes / tp
    if draft_path:
        try:
            d = load_model_arch(draft_path)
            return d.total_params * d.weight_bytes / tp
        except ValueError:
            return arch.mtp_layer_params * arch.weight_bytes / tp
    return max(1, arch.mtp_layers) * arch.mtp_layer_params * arch.weight_bytes / tp
