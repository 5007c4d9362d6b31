"""Model architectures, GPU profiles and SGLang's memory arithmetic, shared by the emulator and the planner.

Pure functions: the only I/O is reading `<model_path>/config.json` when it exists. Every formula names the SGLang
source it follows (paths inside `python/sglang/`, version 0.5.23 unless noted); `docs/emulator.md` explains them.

The one entry point the server and the planner call is `resolve_server(args, env)`: it takes SGLang's argparse dest
names (plus `sim_gpu`) and returns a `ResolvedServer` with every resolved value, the memory budget and the SGLang-style
startup log lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servesweep.sglang import flags

GiB = 1 << 30
MiB = 1 << 20

# ---------------------------------------------------------------------------------------------------------------
# Model architecture
# ---------------------------------------------------------------------------------------------------------------

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# Hybrid GDN architectures (reference sglang.md §7): layer i is full attention iff (i+1) % interval == 0.
_HYBRID_ARCHS = {
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
}


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What the memory arithmetic and the step-time model need to know about a model."""

    name: str
    architectures: tuple[str, ...]
    model_type: str
    num_layers: int
    full_attention_layers: int  # layers that hold KV (all of them for a plain transformer)
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    total_params: int
    active_params: int  # params touched per token (MoE: routed top-k + shared; dense: = total)
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    weight_bytes: float = 2.0  # bytes per parameter (bf16 = 2, fp8 = 1)
    # Gated DeltaNet (linear attention) shape, for the recurrent state slots of hybrid models.
    full_attention_interval: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_ssm_dtype: str = "float32"
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0
    # Multi-token-prediction (NEXTN/MTP) draft layers shipped with the checkpoint.
    mtp_layers: int = 0

    @property
    def is_hybrid(self) -> bool:
        return self.full_attention_layers < self.num_layers and self.linear_num_value_heads > 0

    @property
    def linear_layers(self) -> int:
        return self.num_layers - self.full_attention_layers if self.is_hybrid else 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_full_attention(self, i: int) -> bool:
        if not self.is_hybrid:
            return True
        return (i + 1) % self.full_attention_interval == 0

    @property
    def mtp_layer_params(self) -> int:
        """Params of one MTP/NEXTN draft layer: one decoder layer plus its fusing projection (2h -> h)."""
        return (
            _attention_params(self)
            + _mlp_params_per_layer(self, active=False)
            + 2 * self.hidden * self.hidden
        )


def _attention_params(a: ModelArch) -> int:
    # q (with the output gate of Qwen3.5/3-Next: x2), k, v, o.
    gate = 2 if a.is_hybrid else 1
    q = a.hidden * a.num_heads * a.head_dim * gate
    kv = 2 * a.hidden * a.num_kv_heads * a.head_dim
    o = a.num_heads * a.head_dim * a.hidden
    return q + kv + o


def _linear_attention_params(a: ModelArch) -> int:
    k = a.linear_num_key_heads * a.linear_key_head_dim
    v = a.linear_num_value_heads * a.linear_value_head_dim
    qkv = a.hidden * (2 * k + v)
    z = a.hidden * v
    ba = 2 * a.hidden * a.linear_num_value_heads
    conv = (2 * k + v) * a.linear_conv_kernel_dim
    out = v * a.hidden
    return qkv + z + ba + conv + out


def _mlp_params_per_layer(a: ModelArch, *, active: bool) -> int:
    if a.num_experts:
        experts = a.experts_per_token if active else a.num_experts
        routed = experts * 3 * a.hidden * a.moe_intermediate
        shared = 3 * a.hidden * a.shared_expert_intermediate
        router = a.hidden * a.num_experts
        return routed + shared + router
    return 3 * a.hidden * a.intermediate


def _count_params(a: ModelArch, *, active: bool) -> int:
    emb = a.vocab * a.hidden * (1 if a.tie_word_embeddings else 2)
    attn = a.full_attention_layers * _attention_params(a)
    lin = (a.num_layers - a.full_attention_layers) * _linear_attention_params(a) if a.is_hybrid else 0
    mlp = a.num_layers * _mlp_params_per_layer(a, active=active)
    return emb + attn + lin + mlp


def _layer_layout(
    text: Mapping[str, Any], architectures: tuple[str, ...], num_layers: int
) -> tuple[bool, int, int]:
    """(hybrid, full-attention layers, full_attention_interval): a hybrid model holds KV only in every
    interval-th layer (from `layer_types` when it lists every layer, else from the interval, 4 by default)."""
    interval = int(text.get("full_attention_interval") or 0)
    layer_types = text.get("layer_types")
    hybrid = bool(set(architectures) & _HYBRID_ARCHS) or (
        isinstance(layer_types, list) and "linear_attention" in layer_types
    )
    if not hybrid:
        return False, num_layers, 0
    if isinstance(layer_types, list) and len(layer_types) == num_layers:
        full_layers = sum(1 for t in layer_types if t == "full_attention")
        if not interval:
            interval = num_layers // max(1, full_layers)
    else:
        interval = interval or 4
        full_layers = sum(1 for i in range(num_layers) if (i + 1) % interval == 0)
    return True, full_layers, interval


def _weight_bytes_per_param(cfg: Mapping[str, Any], text: Mapping[str, Any]) -> float:
    """Bytes per weight: the checkpoint's dtype, or its quantization (FP8: 1 byte; else `bits` / 8)."""
    dtype = str(text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    wbytes = float(_DTYPE_BYTES.get(dtype, 2))
    quant = cfg.get("quantization_config") or text.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits") or quant.get("weight_bits")
        if "fp8" in method:
            wbytes = 1.0
        elif bits:
            wbytes = float(bits) / 8
    return wbytes


def _arch_from_config(cfg: Mapping[str, Any], name: str) -> ModelArch:
    """Build a ModelArch from a Hugging Face config.json (flat, or with Qwen3.5-style `text_config` nesting)."""
    text = cfg.get("text_config") or cfg
    architectures = tuple(cfg.get("architectures") or text.get("architectures") or ())

    def need(key: str) -> Any:
        if key not in text:
            raise ValueError(f"model {name!r}: config.json lacks {key!r} (needed for memory arithmetic)")
        return text[key]

    num_layers = int(need("num_hidden_layers"))
    hidden = int(need("hidden_size"))
    num_heads = int(need("num_attention_heads"))
    num_kv_heads = int(text.get("num_key_value_heads") or num_heads)
    head_dim = int(text.get("head_dim") or hidden // num_heads)
    vocab = int(need("vocab_size"))
    # `get_context_length` (srt/utils/hf_transformers_utils.py) reads max_position_embeddings (rope scaling aside).
    max_pos = int(text.get("max_position_embeddings") or cfg.get("max_position_embeddings") or 2048)
    hybrid, full_layers, interval = _layer_layout(text, architectures, num_layers)
    wbytes = _weight_bytes_per_param(cfg, text)
    arch = ModelArch(
        name=name,
        architectures=architectures,
        model_type=str(text.get("model_type") or cfg.get("model_type") or ""),
        num_layers=num_layers,
        full_attention_layers=full_layers,
        hidden=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        intermediate=int(text.get("intermediate_size") or 4 * hidden),
        total_params=0,
        active_params=0,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        weight_bytes=wbytes,
        full_attention_interval=interval,
        linear_num_key_heads=int(text.get("linear_num_key_heads") or 0) if hybrid else 0,
        linear_num_value_heads=int(text.get("linear_num_value_heads") or 0) if hybrid else 0,
        linear_key_head_dim=int(text.get("linear_key_head_dim") or 0) if hybrid else 0,
        linear_value_head_dim=int(text.get("linear_value_head_dim") or 0) if hybrid else 0,
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim") or 4) if hybrid else 0,
        mamba_ssm_dtype=str(text.get("mamba_ssm_dtype") or "float32"),
        num_experts=int(text.get("num_experts") or text.get("n_routed_experts") or 0),
        experts_per_token=int(text.get("num_experts_per_tok") or 0),
        moe_intermediate=int(text.get("moe_intermediate_size") or 0),
        shared_expert_intermediate=int(text.get("shared_expert_intermediate_size") or 0),
        mtp_layers=int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0),
    )
    return replace(
        arch, total_params=_count_params(arch, active=False), active_params=_count_params(arch, active=True)
    )


# Built-in profiles: the shapes of the real checkpoints' config.json (text part), so the emulator needs no download.
_QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5_text",
    "num_hidden_layers": 64,
    "full_attention_interval": 4,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1,
    "torch_dtype": "bfloat16",
}
_QWEN36_35B_A3B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe_text",
    "num_hidden_layers": 40,
    "full_attention_interval": 4,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1,
    "torch_dtype": "bfloat16",
}
_QWEN3_NEXT_80B = {
    **_QWEN36_35B_A3B,
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "vocab_size": 151936,
}
_LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_LLAMA31_70B = {
    **_LLAMA31_8B,
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
}

# key: canonical name; matched against the last path component of --model-path, case-insensitively.
MODEL_PROFILES: dict[str, Mapping[str, Any]] = {
    "Qwen3.6-27B": _QWEN36_27B,
    "Qwen3.5-27B": _QWEN36_27B,
    "Qwen3.6-35B-A3B": _QWEN36_35B_A3B,
    "Qwen3.5-35B-A3B": _QWEN36_35B_A3B,
    "Qwen3-Next-80B-A3B": _QWEN3_NEXT_80B,
    "Llama-3.1-8B": _LLAMA31_8B,
    "Llama-3.1-70B": _LLAMA31_70B,
}


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", s.lower())


def load_model_arch(model_path: str | Path) -> ModelArch:
    """The architecture from `<model_path>/config.json` if it exists, else a built-in profile matched by name."""
    path = Path(str(model_path)).expanduser()
    cfg_file = path / "config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {cfg_file}: {e}") from e
        return _arch_from_config(cfg, str(model_path))
    base = _norm(str(model_path).rstrip("/").rsplit("/", 1)[-1])
    # Longest key first so "qwen3.6-35b-a3b" wins over a shorter accidental match.
    for key in sorted(MODEL_PROFILES, key=len, reverse=True):
        if base.startswith(_norm(key)):
            arch = _arch_from_config(MODEL_PROFILES[key], str(model_path))
            if "fp8" in base:
                arch = replace(arch, weight_bytes=1.0)
            return arch
    raise ValueError(
        f"unknown model {str(model_path)!r}: no config.json at {cfg_file} and no built-in profile matches its name. "
        f"Built-in profiles: {', '.join(MODEL_PROFILES)} (matched by the last path component, e.g. "
        f"'Qwen/Qwen3.6-27B'), or point --model-path at a directory holding config.json."
    )


# ---------------------------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    memory_mib: int  # what `nvidia-smi --query-gpu=memory.total` reports; SGLang sizes defaults from it
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    interconnect_bandwidth: float  # bytes/s per GPU for tensor-parallel all-reduce (NVLink or PCIe)
    interconnect_latency: float  # seconds per all-reduce call (launch + sync)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB


GPU_PROFILES: dict[str, GpuProfile] = {
    "H200": GpuProfile("H200", 143771, 4.8e12, 989.5e12, 450e9, 12e-6),
    "H100": GpuProfile("H100", 81559, 3.35e12, 989.5e12, 450e9, 12e-6),
    "RTX PRO 6000 Blackwell": GpuProfile("RTX PRO 6000 Blackwell", 97887, 1.792e12, 503.8e12, 64e9, 18e-6),
    "RTX A6000": GpuProfile("RTX A6000", 49140, 768e9, 154.8e12, 25e9, 20e-6),
}
_GPU_ALIASES = {
    "h200": "H200",
    "h200sxm": "H200",
    "h200141gb": "H200",
    "h100": "H100",
    "h100sxm": "H100",
    "h10080gb": "H100",
    "h100sxm80gb": "H100",
    "rtxpro6000blackwell": "RTX PRO 6000 Blackwell",
    "rtxpro6000": "RTX PRO 6000 Blackwell",
    "pro6000": "RTX PRO 6000 Blackwell",
    "rtxpro6000blackwellserveredition": "RTX PRO 6000 Blackwell",
    "rtxpro6000blackwellworkstationedition": "RTX PRO 6000 Blackwell",
    "rtx6000blackwell": "RTX PRO 6000 Blackwell",
    "rtxa6000": "RTX A6000",
    "a6000": "RTX A6000",
}


def get_gpu(name: str | None) -> GpuProfile:
    if name is None or name == "":
        return GPU_PROFILES["H200"]
    key = re.sub(r"[^a-z0-9]", "", name.lower()).removeprefix("nvidia")
    if key in _GPU_ALIASES:
        return GPU_PROFILES[_GPU_ALIASES[key]]
    raise ValueError(
        f"unknown GPU profile {name!r}; known: {', '.join(GPU_PROFILES)} "
        f"(aliases: {', '.join(sorted(_GPU_ALIASES))})"
    )


# ---------------------------------------------------------------------------------------------------------------
# SGLang's arithmetic
# ---------------------------------------------------------------------------------------------------------------

BUILTIN_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
# Spec algorithms whose input check reserves draft slots (managers/utils.py::compute_num_reserved_tokens).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
SPEC_MAX_RUNNING_REQUESTS = 48

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
    ssm_b = _DTYPE_BYTES.get((ssm_dtype or arch.mamba_ssm_dtype).lower(), 4)
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


def context_length_error(asked: int, derived: int) -> str:
    """The exact ValueError text of srt/configs/model_config.py::_derive_context_length."""
    return (
        f"Warning: User-specified context_length ({asked}) is greater than the derived context_length ({derived}). "
        f"This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ "
        f"from max_position_embeddings in the model's config. To allow overriding this maximum, set the env var "
        f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
    )


def _env_true(env: Mapping[str, str], key: str) -> bool:
    return str(env.get(key, "")).strip().lower() in ("1", "true", "yes", "on")


def _version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return (0, 5, 23)
    nums = re.findall(r"\d+", str(v))
    return tuple(int(n) for n in nums[:3]) or (0, 5, 23)


@dataclass(slots=True)
class ResolvedServer:
    """Everything SGLang resolves at start-up, as the emulator's /server_info and the planner need it."""

    args: dict[str, Any]  # every resolved server arg by SGLang dest name (what /server_info shows flat)
    arch: ModelArch
    gpu: GpuProfile
    tp_size: int
    dp_size: int
    context_len: int
    max_total_num_tokens: int  # per DP rank: the KV pool in tokens
    max_req_input_len: int
    effective_max_running_requests: int  # per DP rank
    max_queued_requests: int | None
    chunked_prefill_size: int  # -1 = disabled
    max_prefill_tokens: int
    page_size: int
    kv_bytes_per_token: float  # per rank
    state_slot_bytes: int  # per rank, 0 for non-hybrid models
    state_slots: int  # max_mamba_cache_size (0 for non-hybrid models)
    mem_fraction_static: float
    memory_usage: dict[str, Any]
    spec_algorithm: str | None  # as /server_info reports it (NEXTN -> EAGLE)
    spec_algorithm_asked: str | None
    spec_num_steps: int | None
    spec_eagle_topk: int | None
    spec_num_draft_tokens: int | None
    num_reserved_tokens: int  # added to the input length in the context checks (EAGLE family)
    radix_cache: bool
    mamba_radix_cache_strategy: str | None
    sglang_version: str
    log_lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mamba_ratio: int = 0  # state slots per running request (kv_cache_configurator._calculate_mamba_ratio)

    @property
    def is_hybrid(self) -> bool:
        return self.arch.is_hybrid


# The server args the resolution below reads (what it models), by ServerArgs field. A version that lacks one (the mamba strategy
# is mamba_scheduler_strategy before 0.5.15, cuda_graph_max_bs_decode was cuda_graph_max_bs) leaves it None, which
# the steps resolve as SGLang does.
RESOLVED_FLAGS = (
    "model_path",
    "tp_size",
    "dp_size",
    "pp_size",
    "context_length",
    "mem_fraction_static",
    "max_running_requests",
    "max_queued_requests",
    "max_total_tokens",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "kv_cache_dtype",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "speculative_dflash_block_size",
    "speculative_ngram_max_bfs_breadth",
    "mamba_radix_cache_strategy",
    "mamba_scheduler_strategy",
    "mamba_full_memory_ratio",
    "max_mamba_cache_size",
    "mamba_ssm_dtype",
    "disable_radix_cache",
    "disable_overlap_schedule",
    "enable_mixed_chunk",
    "cuda_graph_max_bs",
    "cuda_graph_max_bs_decode",
)


def _arg_defaults(version: str) -> dict[str, Any]:
    """SGLang `version`'s defaults from its flag table, by ServerArgs field, plus RESOLVED_FLAGS it lacks as None."""
    a: dict[str, Any] = dict.fromkeys(RESOLVED_FLAGS)
    a.update(flags.defaults(version))
    return a


def _spec_defaults(algo: str, arch: ModelArch) -> tuple[int, int, int]:
    """(steps, topk, draft) when none is given: srt/arg_groups/speculative_hook.py::auto_choose_speculative_params."""
    if algo == "STANDALONE":
        return 3, 1, 4
    if "LlamaForCausalLM" in arch.architectures or "GrokForCausalLM" in arch.architectures:
        return 5, 4, 8
    return 3, 1, 4


@dataclass(slots=True)
class _Resolution:
    """What resolve_server's steps read and fill in, step by step; `a` is the server args by SGLang dest name."""

    a: dict[str, Any]
    env: dict[str, str]
    version: str
    vt: tuple[int, ...]
    gpu: GpuProfile
    arch: ModelArch
    extra_spec: set[str]
    log: list[str] = field(default_factory=list)
    warns: list[str] = field(default_factory=list)
    tp: int = 1
    dp: int = 1
    pp: int = 1
    spec_asked: Any = None
    spec: str | None = None
    steps: Any = None
    topk: Any = None
    draft: Any = None
    reserved_tokens: int = 0
    context_asked: int | None = None
    context_len: int = 0
    radix: bool = True
    strategy: str | None = None
    page_size: int = 1
    chunk: int = 0
    max_prefill: int = 0
    graph_bs: int = 0
    frac: float = 0.0
    pre_load_gib: float = 0.0
    weights: float = 0.0
    draft_weights: float = 0.0
    rest_gib: float = 0.0
    kv_dtype: str = "auto"
    cell: float = 0.0
    slot: int = 0
    slots: int = 0
    mamba_ratio: int = 0
    intermediate_gib: float = 0.0
    tokens: int = 0
    mrr: int = 0
    max_req_input_len: int = 0
    kv_gib: float = 0.0
    avail_after_gib: float = 0.0

    def warn(self, msg: str) -> None:
        self.warns.append(msg)
        self.log.append(f"WARNING {msg}")


def _start_resolution(
    args: Mapping[str, Any], env: Mapping[str, str] | None, extra_spec_algorithms: Iterable[str] | None
) -> _Resolution:
    """Merge `args` over SGLang's defaults and take out the emulator's `sim_*` settings (GPU, version, forks)."""
    version = str(args.get("sim_sglang_version") or "0.5.23")
    a = _arg_defaults(version)
    for k, v in args.items():
        if v is not None or k not in a:
            a[k] = v
    # SGLang before 0.5.15 names this flag --mamba-scheduler-strategy; both set the same dest.
    old_name = a.pop("mamba_scheduler_strategy", None)
    if args.get("mamba_scheduler_strategy") is not None or a["mamba_radix_cache_strategy"] is None:
        a["mamba_radix_cache_strategy"] = old_name
    # None from 0.5.20 on, resolved to 0.9 (mem_cache/kv_cache_configurator.py); earlier versions default to 0.9
    a["mamba_full_memory_ratio"] = (
        0.9 if a["mamba_full_memory_ratio"] is None else a["mamba_full_memory_ratio"]
    )
    if not a.get("model_path"):
        raise ValueError("--model-path is required")
    a.pop("sim_sglang_version", None)
    gpu = get_gpu(a.pop("sim_gpu", None))
    extra = {s.upper() for s in (extra_spec_algorithms or ())}
    more = a.pop("sim_extra_spec_algorithms", None) or ()
    if isinstance(more, str):
        more = more.split(",")
    extra |= {str(s).strip().upper() for s in more if str(s).strip()}
    for k in [k for k in a if k.startswith("sim_")]:
        a.pop(k)
    return _Resolution(
        a=a,
        env=dict(env or {}),
        version=version,
        vt=_version_tuple(version),
        gpu=gpu,
        arch=load_model_arch(a["model_path"]),
        extra_spec=extra,
    )


def _check_parallelism(r: _Resolution) -> None:
    """tp/dp sizes, and the attention heads tp must divide; notes SGLANG_ENABLE_SPEC_V2, which 0.5.15 removed."""
    a = r.a
    if "SGLANG_ENABLE_SPEC_V2" in r.env and r.vt >= (0, 5, 15):
        # arg_groups/speculative_hook.py: setting it only logs a notice (reference §0)
        r.warn(
            "SGLANG_ENABLE_SPEC_V2 has been removed; it has no effect. Use --disable-overlap-schedule to turn spec v2 off."
        )
    r.tp = int(a["tp_size"] or 1)
    r.dp = int(a["dp_size"] or 1)
    r.pp = int(a.get("pp_size") or 1)
    if r.tp < 1 or r.dp < 1:
        raise ValueError(f"--tp-size and --dp-size must be >= 1 (got tp={r.tp}, dp={r.dp})")
    if r.arch.num_heads % r.tp:
        raise ValueError(
            f"Total number of attention heads ({r.arch.num_heads}) must be divisible by tensor parallel size ({r.tp})."
        )


def _resolve_spec_algorithm(r: _Resolution) -> None:
    """The algorithm's name (srt/speculative/spec_info.py::SpeculativeAlgorithm.from_string; NEXTN runs as EAGLE)."""
    r.spec_asked = r.a.get("speculative_algorithm")
    if r.spec_asked:
        name = str(r.spec_asked).upper()
        if name not in BUILTIN_SPEC_ALGORITHMS and name not in r.extra_spec:
            raise ValueError(f"Unknown speculative algorithm name: {r.spec_asked}")
        r.spec = "EAGLE" if name == "NEXTN" else name


def _resolve_spec_budget(r: _Resolution) -> None:
    """Steps, top-k and draft tokens per algorithm (speculative_hook.py), and the tokens the EAGLE family reserves."""
    a, spec = r.a, r.spec
    steps, topk, draft = (
        a["speculative_num_steps"],
        a["speculative_eagle_topk"],
        a["speculative_num_draft_tokens"],
    )
    if spec in ("DFLASH", "DSPARK"):
        steps, topk = 1, 1
        if draft is None:
            draft = int(a.get("speculative_dflash_block_size") or 16)
        if spec == "DFLASH" and not a.get("speculative_draft_model_path"):
            raise ValueError("DFLASH speculative decoding requires --speculative-draft-model-path")
    elif spec == "NGRAM":
        steps = steps or 1
        topk = topk or int(a.get("speculative_ngram_max_bfs_breadth") or 10)
        draft = draft or 12
    elif spec is not None and spec in r.extra_spec:
        # A forked algorithm (e.g. DDTREE): its budget is num_draft_tokens; steps/topk are passed through.
        steps = steps or 1
        topk = topk or 1
        draft = draft or 16
    elif spec is not None:
        steps, topk, draft = _eagle_budget(r, steps, topk, draft)
    if spec is None:
        steps = topk = draft = None
    r.steps, r.topk, r.draft = steps, topk, draft
    a["speculative_algorithm"] = spec
    a["speculative_num_steps"], a["speculative_eagle_topk"], a["speculative_num_draft_tokens"] = (
        steps,
        topk,
        draft,
    )
    r.reserved_tokens = max(int(topk or 0) * int(steps or 0), int(draft or 0)) if spec in EAGLE_FAMILY else 0


def _eagle_budget(r: _Resolution, steps: Any, topk: Any, draft: Any) -> tuple[int, int, int]:
    """EAGLE-style budgets: the defaults fill what is not given; with top-k 1 the draft is steps + 1."""
    assert r.spec is not None  # called for a speculative algorithm only
    d_steps, d_topk, d_draft = _spec_defaults(r.spec, r.arch)
    if steps is None and topk is None and draft is None:
        steps, topk, draft = d_steps, d_topk, d_draft
    else:
        steps = d_steps if steps is None else int(steps)
        topk = d_topk if topk is None else int(topk)
        draft = d_draft if draft is None else int(draft)
    if topk == 1 and draft != steps + 1:
        if r.a["speculative_num_draft_tokens"] is not None:
            r.warn(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                "speculative_eagle_topk == 1"
            )
        draft = steps + 1
    return steps, topk, draft


def _reset_running_requests_for_spec(r: _Resolution) -> None:
    """server_args.py::_handle_speculative_decoding: any spec algorithm sets an unset max_running_requests to 48."""
    if r.spec is not None and r.a["max_running_requests"] is None:
        r.a["max_running_requests"] = SPEC_MAX_RUNNING_REQUESTS
        r.warn(
            "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
            "setting --max-running-requests."
        )


def _resolve_context_length(r: _Resolution) -> None:
    """srt/configs/model_config.py::_derive_context_length: above the model's maximum only with the override."""
    derived = r.arch.max_position_embeddings
    asked = r.a["context_length"]
    if asked is None:
        r.context_len = derived
        return
    asked = int(asked)
    r.context_asked = asked
    if asked > derived:
        if not _env_true(r.env, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
            raise ValueError(context_length_error(asked, derived))
        r.warn(context_length_error(asked, derived).split(" To allow")[0])
    r.context_len = asked


def _resolve_mamba_strategy(r: _Resolution) -> None:
    """Hybrid models' radix cache strategy (arg_groups/overrides.py::_mamba_radix_cache_resolution) and page size."""
    a, arch = r.a, r.arch
    r.radix = not bool(a["disable_radix_cache"])
    page_size = a["page_size"]
    if arch.is_hybrid:
        strategy = str(a["mamba_radix_cache_strategy"] or "auto")
        if strategy == "auto":
            if r.vt >= (0, 5, 15) and (not a["disable_overlap_schedule"] or (page_size or 1) > 1):
                strategy = "extra_buffer"
            else:
                strategy = "no_buffer"
        if strategy == "no_buffer":
            a["disable_overlap_schedule"] = True
            page_size = 1
            if r.spec is not None and r.radix and r.vt <= (0, 5, 12):
                arch_name = arch.architectures[0] if arch.architectures else arch.name
                raise ValueError(
                    f"Speculative decoding for {arch_name} is not compatible with radix cache when using "
                    f"--mamba-scheduler-strategy no_buffer. To use radix cache with speculative decoding, please "
                    f"use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
                )
        a["mamba_radix_cache_strategy"] = strategy
        r.strategy = strategy
    r.page_size = int(page_size or 1)
    a["page_size"] = r.page_size


def _resolve_memory_defaults(r: _Resolution) -> None:
    """Chunked prefill, CUDA graph batch and mem_fraction_static defaults from GPU memory (memory_hook.py)."""
    a, gpu_mem = r.a, r.gpu.memory_mib
    chunk = a["chunked_prefill_size"]
    r.chunk = default_chunked_prefill_size(gpu_mem) if chunk is None else int(chunk)
    a["chunked_prefill_size"] = r.chunk
    r.max_prefill = int(a["max_prefill_tokens"] or 16384)
    graph_bs = a.get("cuda_graph_max_bs")
    if graph_bs is None:
        graph_bs = a.get("cuda_graph_max_bs_decode")  # its name from SGLang 0.5.15 on
    graph_bs = default_cuda_graph_max_bs(gpu_mem, r.tp) if graph_bs is None else int(graph_bs)
    if a["max_running_requests"] is not None:
        graph_bs = min(graph_bs, int(a["max_running_requests"]))
    r.graph_bs = a["cuda_graph_max_bs"] = graph_bs
    frac = a["mem_fraction_static"]
    if frac is None:
        frac = auto_mem_fraction_static(
            gpu_mem, r.chunk if r.chunk > 0 else r.max_prefill, r.tp, graph_bs, r.pp
        )
    frac = float(frac)
    if not 0 < frac < 1:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {frac}")
    r.frac = a["mem_fraction_static"] = frac


def _profile_available_memory(r: _Resolution) -> None:
    """model_executor/model_runner_kv_cache_mixin.py::_profile_available_bytes: what the weights leave for caches,
    rest = post_load_free - pre_load_free * (1 - mem_fraction_static) = frac * pre_load_free - weights."""
    r.pre_load_gib = r.gpu.memory_mib / 1024 - _runtime_overhead_gib(
        r.tp
    )  # free after CUDA context and NCCL init
    r.weights = weight_bytes_per_rank(r.arch, r.tp)
    r.draft_weights = _draft_weight_bytes(r.spec, r.arch, r.a.get("speculative_draft_model_path"), r.tp)
    r.rest_gib = r.frac * r.pre_load_gib - (r.weights + r.draft_weights) / GiB
    if r.rest_gib <= 0:
        raise RuntimeError(
            f"Not enough memory. Please try to increase --mem-fraction-static. (weights {r.weights / GiB:.2f} GiB "
            f"per rank on {r.gpu.name} with {r.gpu.memory_mib / 1024:.1f} GiB, mem_fraction_static={r.frac})"
        )
    r.kv_dtype = str(r.a["kv_cache_dtype"] or "auto")
    r.cell = kv_bytes_per_token(r.arch, r.tp, r.kv_dtype)
    r.slot = state_slot_bytes(r.arch, r.tp, r.a.get("mamba_ssm_dtype"))


def _allocate_state_slots(r: _Resolution) -> None:
    """Hybrid models: recurrent-state slots (and spec's intermediate state) come out of the rest before the KV pool
    (mem_cache/kv_cache_configurator.py::_handle_max_mamba_cache)."""
    if not r.arch.is_hybrid:
        return
    a, slot, dp = r.a, r.slot, r.dp
    r.mamba_ratio = _mamba_ratio(r.radix, r.strategy, bool(a["disable_overlap_schedule"]))
    D = int(r.draft or 0) if r.spec else 0
    mrr_now = a["max_running_requests"]
    if a["max_mamba_cache_size"] is not None:
        slots = int(a["max_mamba_cache_size"]) // dp
        if r.spec:
            capped = min(int(mrr_now) // dp, slots // r.mamba_ratio)
            r.intermediate_gib = slot * capped * D / GiB
    elif not r.radix and mrr_now is not None:
        slots = int(mrr_now) // dp
        if r.spec:
            r.intermediate_gib = slot * slots * D / GiB
    else:
        # mamba : KV = ratio : 1 (mamba_full_memory_ratio, 0.9 by default)
        ratio = float(a["mamba_full_memory_ratio"])
        budget = r.rest_gib * ratio / (1 + ratio) * GiB
        if r.spec:
            slots = int(budget // (slot * (1 + D / r.mamba_ratio)))
            capped = min(int(mrr_now) // dp, slots // r.mamba_ratio)
            r.intermediate_gib = slot * capped * D / GiB
        else:
            slots = int(budget // slot)
    if slots <= 0:
        raise RuntimeError(
            "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Try: (1) reduce "
            "--max-running-requests, (2) increase --mem-fraction-static, (3) reduce "
            "--speculative-num-draft-tokens, or (4) use GPUs with more memory."
        )
    r.rest_gib = r.rest_gib - r.intermediate_gib - slots * slot / GiB
    r.slots = a["max_mamba_cache_size"] = slots


def _allocate_kv_pool(r: _Resolution) -> None:
    """The KV pool in tokens: what is left over the per-token KV bytes, capped by --max-total-tokens, whole pages."""
    tokens = int(r.rest_gib * GiB // r.cell)
    if tokens <= 0:
        raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    if r.a["max_total_tokens"] is not None:
        cap = int(r.a["max_total_tokens"])
        if cap > tokens:
            r.warn(
                f"max_total_tokens={cap} is larger than the profiled value {tokens}. Use the profiled value instead."
            )
        tokens = min(tokens, cap)
    r.tokens = tokens // r.page_size * r.page_size


def _resolve_max_running_requests(r: _Resolution) -> None:
    """kv_cache_configurator.py::resolve_max_num_reqs: per DP rank, bounded by the KV pool and the state slots."""
    estimated = max(min(int(r.tokens / r.context_len * 512), 4096), 2048)
    if r.a["max_running_requests"] is not None:
        requested = int(r.a["max_running_requests"]) // r.dp
        mrr = min(requested, r.tokens // 2)
    else:
        requested = None
        mrr = min(estimated, r.tokens // 2)
    if r.arch.is_hybrid:
        cap_m = r.slots // r.mamba_ratio
        if cap_m < mrr:
            r.warn(
                f"max_running_requests is capped to {cap_m} by the mamba state cache "
                f"(max_mamba_cache_size={r.slots}, mamba_ratio={r.mamba_ratio})."
            )
        mrr = min(mrr, cap_m)
        if mrr <= 0:
            raise RuntimeError(
                f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                f"max_mamba_cache_size={r.slots}, mamba_ratio={r.mamba_ratio}, resulting max_num_reqs={mrr}."
            )
    if requested is not None and mrr < requested:
        r.warn(
            f"max_running_requests was reduced from the requested {requested} to {mrr} (per dp worker) due to the "
            f"available KV cache capacity."
        )
    r.mrr = mrr


def _resolve_max_input_len(r: _Resolution) -> None:
    """managers/tp_worker.py: max_req_input_len = min(context_len - 1, kv_capacity - 1) - 5."""
    r.max_req_input_len = min(r.context_len - 1, r.tokens - 1) - 5
    if r.tokens < r.context_len:
        r.warn(
            f"KV pool holds {r.tokens} tokens, fewer than --context-length {r.context_len}: longer prompts are "
            f"rejected at runtime."
        )


def _write_back_args(r: _Resolution) -> None:
    """The resolved args as SGLang's server args show them; max_running_requests stays as set (48 under spec)."""
    r.a["tp_size"], r.a["dp_size"] = r.tp, r.dp
    r.a["context_length"] = r.context_asked
    r.a["kv_cache_dtype"] = r.kv_dtype


def _log_allocation(r: _Resolution) -> None:
    """SGLang's start-up log lines for the weights, the state cache and the KV pool."""
    arch, weights_gib, tokens = r.arch, r.weights / GiB, r.tokens
    r.kv_gib = tokens * r.cell / GiB
    r.avail_after_gib = r.pre_load_gib - r.frac * r.pre_load_gib + max(0.0, r.rest_gib - r.kv_gib)
    r.log.append(
        f"Load weight end. type={arch.architectures[0] if arch.architectures else arch.model_type}, "
        f"dtype=torch.bfloat16, avail mem={r.pre_load_gib - weights_gib:.2f} GB, mem usage={weights_gib:.2f} GB."
    )
    if arch.is_hybrid:
        r.log.append(
            f"Mamba Cache is allocated. max_mamba_cache_size: {r.slots}, conv_state and ssm_state size: "
            f"{r.slots * r.slot / GiB:.2f}GB"
        )
    r.log.append(
        f"KV Cache is allocated. #tokens: {tokens}, K size: {r.kv_gib / 2:.2f} GB, V size: {r.kv_gib / 2:.2f} GB"
    )
    r.log.append(
        f"max_total_num_tokens={tokens}, chunked_prefill_size={r.chunk}, max_prefill_tokens={r.max_prefill}, "
        f"max_running_requests={r.mrr}, context_len={r.context_len}, available_gpu_mem={r.avail_after_gib:.2f} GB"
    )


# resolve_server's steps, in SGLang's start-up order (each warning lands in the log where SGLang logs it).
_RESOLUTION_STEPS = (
    _check_parallelism,
    _resolve_spec_algorithm,
    _resolve_spec_budget,
    _reset_running_requests_for_spec,
    _resolve_context_length,
    _resolve_mamba_strategy,
    _resolve_memory_defaults,
    _profile_available_memory,
    _allocate_state_slots,
    _allocate_kv_pool,
    _resolve_max_running_requests,
    _resolve_max_input_len,
    _write_back_args,
    _log_allocation,
)


def resolve_server(
    args: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    extra_spec_algorithms: set[str] | frozenset[str] | None = None,
) -> ResolvedServer:
    """Resolve SGLang's "auto" server args and memory budget the way SGLang does at start-up.

    `args` uses SGLang's argparse dest names plus `sim_gpu` (GPU profile, default H200) and optionally
    `sim_sglang_version` (flag semantics of that version) and `sim_extra_spec_algorithms` (forked builds).
    Raises ValueError with SGLang's own text for an unknown speculative algorithm and an over-long context.
    """
    r = _start_resolution(args, env, extra_spec_algorithms)
    for step in _RESOLUTION_STEPS:
        step(r)
    return _resolved_server(r)


def _memory_usage(r: _Resolution) -> dict[str, Any]:
    """/server_info's memory_usage (GiB per rank)."""
    usage: dict[str, Any] = {
        "weight": round((r.weights + r.draft_weights) / GiB, 2),
        "kvcache": round(r.kv_gib, 2),
        "startup_available": round(r.avail_after_gib, 2),
        "token_capacity": r.tokens,
        "token_capacity_swa": None,
        "graph": {"decode": round(r.graph_bs * 2 / 1024, 2)},
    }
    if r.arch.is_hybrid:
        usage["mamba"] = round(r.slots * r.slot / GiB + r.intermediate_gib, 2)
    return usage


def _resolved_server(r: _Resolution) -> ResolvedServer:
    a = r.a
    return ResolvedServer(
        args=a,
        arch=r.arch,
        gpu=r.gpu,
        tp_size=r.tp,
        dp_size=r.dp,
        context_len=r.context_len,
        max_total_num_tokens=r.tokens,
        max_req_input_len=r.max_req_input_len,
        effective_max_running_requests=r.mrr,
        max_queued_requests=None if a["max_queued_requests"] is None else int(a["max_queued_requests"]),
        chunked_prefill_size=r.chunk,
        max_prefill_tokens=r.max_prefill,
        page_size=r.page_size,
        kv_bytes_per_token=r.cell,
        state_slot_bytes=r.slot,
        state_slots=r.slots,
        mem_fraction_static=r.frac,
        memory_usage=_memory_usage(r),
        spec_algorithm=r.spec,
        spec_algorithm_asked=str(r.spec_asked).upper() if r.spec_asked else None,
        spec_num_steps=r.steps,
        spec_eagle_topk=r.topk,
        spec_num_draft_tokens=r.draft,
        num_reserved_tokens=r.reserved_tokens,
        radix_cache=r.radix,
        mamba_radix_cache_strategy=r.strategy,
        sglang_version=r.version,
        log_lines=r.log,
        warnings=r.warns,
        mamba_ratio=r.mamba_ratio,
    )


def _runtime_overhead_gib(tp: int) -> float:
    """GiB already in use before weights load: CUDA context (~0.5 GiB) plus NCCL buffers when tp > 1."""
    return 0.5 + (0.3 if tp > 1 else 0.0)


def _mamba_ratio(radix: bool, strategy: str | None, no_overlap: bool) -> int:
    """kv_cache_configurator.py::_calculate_mamba_ratio: 1 without radix; 3, +2 (extra_buffer, overlap),
    +1 (extra_buffer_lazy, or extra_buffer without overlap)."""
    if not radix:
        return 1
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        if no_overlap:
            return 4
        return 4 if strategy == "extra_buffer_lazy" else 5
    return 3


# A DFLASH/DSPARK draft is a small block-diffusion drafter, not a copy of the target: the z-lab drafters stack a few
# decoder layers of the target's width, read the target's hidden states of a few layers through one fusing
# projection, and share the target's embedding and LM head. Without the draft's config.json we assume this shape.
DFLASH_DEFAULT_DRAFT_LAYERS = 5
DFLASH_DEFAULT_TARGET_LAYERS_TAPPED = 5


def dflash_draft_params(arch: ModelArch, draft_path: Any = None) -> int:
    """Params of a DFLASH drafter: its decoder layers (plain attention + MLP) and the fusing projection, sized from
    `<draft_path>/config.json` when it is a local folder, else DFLASH_DEFAULT_DRAFT_LAYERS layers of the target's
    shape. The embedding and LM head are the target's (shared), so they are not counted again."""
    layers, tapped, shape = DFLASH_DEFAULT_DRAFT_LAYERS, DFLASH_DEFAULT_TARGET_LAYERS_TAPPED, arch
    cfg_file = Path(str(draft_path)).expanduser() / "config.json" if draft_path else None
    if cfg_file is not None and cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the DFLASH draft's {cfg_file}: {e}") from e
        text = cfg.get("text_config") or cfg
        d = _arch_from_config({**text, "vocab_size": text.get("vocab_size") or arch.vocab}, str(draft_path))
        layers, shape = d.num_layers, d
        dcfg = cfg.get("dflash_config") or {}
        ids = dcfg.get("target_layer_ids") if isinstance(dcfg, Mapping) else None
        tapped = len(ids) if isinstance(ids, list) and ids else tapped
    # the drafter's layers are plain attention (no output gate) + a dense MLP
    plain = replace(shape, full_attention_layers=shape.num_layers, linear_num_value_heads=0)
    per_layer = _attention_params(plain) + _mlp_params_per_layer(plain, active=False)
    return layers * per_layer + tapped * arch.hidden * plain.hidden


def _draft_weight_bytes(spec: str | None, arch: ModelArch, draft_path: Any, tp: int) -> float:
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


def describe(resolved: ResolvedServer) -> dict[str, Any]:
    """A compact, JSON-ready summary for planners and logs."""
    return {
        "model": resolved.arch.name,
        "gpu": resolved.gpu.name,
        "tp_size": resolved.tp_size,
        "context_len": resolved.context_len,
        "max_total_num_tokens": resolved.max_total_num_tokens,
        "max_running_requests": resolved.effective_max_running_requests,
        "kv_bytes_per_token": resolved.kv_bytes_per_token,
        "state_slot_bytes": resolved.state_slot_bytes,
        "state_slots": resolved.state_slots,
        "mem_fraction_static": resolved.mem_fraction_static,
        "kv_heads_replicated": resolved.tp_size > resolved.arch.num_kv_heads,
        "spec_algorithm": resolved.spec_algorithm,
        "weights_gib_per_rank": resolved.memory_usage["weight"],
        "kvcache_gib_per_rank": resolved.memory_usage["kvcache"],
        "max_req_input_len": resolved.max_req_input_len,
    }
