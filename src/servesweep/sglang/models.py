"""Model architectures: what the memory arithmetic and the step-time model know about a model.

`ModelArch` is read from `<model_path>/config.json` when it exists, else from a built-in profile matched by the
model's name (the shapes of the real checkpoints' config.json, so the emulator needs no download). Parameter counts
(whole model, active per token, one MTP draft layer, a DFLASH drafter) are computed from the shape. The only I/O is
reading a config.json.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Bytes per element by dtype name (config.json's torch_dtype, mamba_ssm_dtype); memory.py reads it for the state slot.
DTYPE_BYTES = {
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


def _attention_params(arch: ModelArch) -> int:
    # q (with the output gate of Qwen3.5/3-Next: x2), k, v, o.
    gate = 2 if arch.is_hybrid else 1
    q = arch.hidden * arch.num_heads * arch.head_dim * gate
    kv = 2 * arch.hidden * arch.num_kv_heads * arch.head_dim
    o = arch.num_heads * arch.head_dim * arch.hidden
    return q + kv + o


def _linear_attention_params(arch: ModelArch) -> int:
    k = arch.linear_num_key_heads * arch.linear_key_head_dim
    v = arch.linear_num_value_heads * arch.linear_value_head_dim
    qkv = arch.hidden * (2 * k + v)
    z = arch.hidden * v
    ba = 2 * arch.hidden * arch.linear_num_value_heads
    conv = (2 * k + v) * arch.linear_conv_kernel_dim
    out = v * arch.hidden
    return qkv + z + ba + conv + out


def _mlp_params_per_layer(arch: ModelArch, *, active: bool) -> int:
    if arch.num_experts:
        experts = arch.experts_per_token if active else arch.num_experts
        routed = experts * 3 * arch.hidden * arch.moe_intermediate
        shared = 3 * arch.hidden * arch.shared_expert_intermediate
        router = arch.hidden * arch.num_experts
        return routed + shared + router
    return 3 * arch.hidden * arch.intermediate


def _count_params(arch: ModelArch, *, active: bool) -> int:
    emb = arch.vocab * arch.hidden * (1 if arch.tie_word_embeddings else 2)
    attn = arch.full_attention_layers * _attention_params(arch)
    lin = (arch.num_layers - arch.full_attention_layers) * _linear_attention_params(arch) if arch.is_hybrid else 0
    mlp = arch.num_layers * _mlp_params_per_layer(arch, active=active)
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
    wbytes = float(DTYPE_BYTES.get(dtype, 2))
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
# Qwen3.5's hybrid layout, shared by Qwen3.6's dense and MoE checkpoints: every fourth layer full attention, the others
# Gated DeltaNet (linear attention with a conv kernel and a float32 SSM state), one MTP layer, Qwen3.5's vocabulary.
_QWEN35_HYBRID = {
    "full_attention_interval": 4,
    "head_dim": 256,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1,
    "torch_dtype": "bfloat16",
}
_QWEN36_27B = {
    **_QWEN35_HYBRID,
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5_text",
    "num_hidden_layers": 64,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "linear_num_value_heads": 48,
}
_QWEN36_35B_A3B = {
    **_QWEN35_HYBRID,
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe_text",
    "num_hidden_layers": 40,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "linear_num_value_heads": 32,
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
