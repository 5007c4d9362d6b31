"""SGLang's start-up resolution of its server args and memory budget, shared by the emulator and the planner.

The one entry point the server and the planner call is `resolve_server(args, env)`: it takes SGLang's argparse dest
names (plus the emulator's `sim_gpu`, `sim_sglang_version`, `sim_extra_spec_algorithms`), merges them over that
SGLang version's defaults and returns a `ResolvedServer` with every resolved value, the memory budget and the
SGLang-style startup log lines.

Each step below is a function of named inputs that returns a named result (a value or a small frozen dataclass);
warnings go to the `_StartupLog` a step is handed, where SGLang logs them. `_resolve_args` and `_resolve_pools` run
the steps in SGLang's start-up order and are the only places that write a resolved value back into the server args
(what /server_info shows flat). Every formula names the SGLang source it follows (paths inside `python/sglang/`,
version 0.5.23 unless noted); `docs/emulator.md` explains them. The per-rank formulas are in `sglang/memory.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servesweep.sglang import flags
from servesweep.sglang.gpus import GiB, GpuProfile, get_gpu
from servesweep.sglang.memory import (
    auto_mem_fraction_static,
    calculate_mamba_ratio,
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    draft_weight_bytes_per_rank,
    kv_bytes_per_token,
    runtime_overhead_gib,
    state_slot_bytes,
    weight_bytes_per_rank,
)
from servesweep.sglang.models import ModelArch, load_model_arch

BUILTIN_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
# Spec algorithms whose input check reserves draft slots (managers/utils.py::compute_num_reserved_tokens).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
SPEC_MAX_RUNNING_REQUESTS = 48


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
    defaults: dict[str, Any] = dict.fromkeys(RESOLVED_FLAGS)
    defaults.update(flags.defaults(version))
    return defaults


def _spec_defaults(algorithm: str, arch: ModelArch) -> tuple[int, int, int]:
    """(steps, topk, draft) when none is given: srt/arg_groups/speculative_hook.py::auto_choose_speculative_params."""
    if algorithm == "STANDALONE":
        return 3, 1, 4
    if "LlamaForCausalLM" in arch.architectures or "GrokForCausalLM" in arch.architectures:
        return 5, 4, 8
    return 3, 1, 4


# ---------------------------------------------------------------------------------------------------------------
# What the steps take and give
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Start:
    """The merged server args and what the emulator's `sim_*` settings chose (GPU, SGLang version, forks)."""

    server_args: dict[str, Any]  # by SGLang dest name; the phases below write the resolved values back into it
    env: dict[str, str]
    sglang_version: str
    version: tuple[int, ...]  # sglang_version as numbers, for the version-dependent steps
    gpu: GpuProfile
    arch: ModelArch
    extra_spec_algorithms: frozenset[str]  # upper case


@dataclass(slots=True)
class _StartupLog:
    """SGLang's start-up log lines, in order, and the warnings among them."""

    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)
        self.lines.append(f"WARNING {msg}")


@dataclass(frozen=True, slots=True)
class _Parallelism:
    tp: int
    dp: int
    pp: int


@dataclass(frozen=True, slots=True)
class _SpecBudget:
    """The speculative budget per verify step (all None without speculative decoding)."""

    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    reserved_tokens: int  # what the EAGLE family's input check adds to a request's length


@dataclass(frozen=True, slots=True)
class _ContextLength:
    asked: int | None  # --context-length as given (what the server args keep)
    resolved: int  # the context length the server runs with


@dataclass(frozen=True, slots=True)
class _CacheLayout:
    radix_cache: bool
    mamba_strategy: str | None  # hybrid models only
    disable_overlap_schedule: Any  # as given, or True where the no_buffer strategy turns overlap off
    page_size: int


@dataclass(frozen=True, slots=True)
class _MemoryDefaults:
    chunked_prefill_size: int  # -1 = disabled
    max_prefill_tokens: int
    cuda_graph_max_bs: int
    mem_fraction_static: float


@dataclass(frozen=True, slots=True)
class _ResolvedArgs:
    """What the ServerArgs hooks and the model config resolve before the model loads."""

    parallelism: _Parallelism
    spec_algorithm_asked: Any  # --speculative-algorithm as given
    spec_algorithm: str | None  # as SGLang runs it (NEXTN -> EAGLE)
    spec: _SpecBudget
    max_running_requests: int | None  # the server arg after the speculative reset (per server, not per DP rank)
    context: _ContextLength
    cache: _CacheLayout
    memory: _MemoryDefaults


@dataclass(frozen=True, slots=True)
class _AvailableMemory:
    """Per rank: what is free before the weights load, the weights, and what they leave for the caches."""

    pre_load_free_gib: float  # free after the CUDA context and NCCL init
    weight_bytes: float
    draft_weight_bytes: float
    cache_budget_gib: float  # mem_fraction_static * pre_load_free - weights: for the state slots and the KV pool


@dataclass(frozen=True, slots=True)
class _CellSizes:
    kv_cache_dtype: str
    kv_bytes_per_token: float  # per rank
    state_slot_bytes: int  # per rank, 0 for non-hybrid models


@dataclass(frozen=True, slots=True)
class _StateCache:
    """Hybrid models' recurrent-state slots (zeros for other models) and what they leave for the KV pool."""

    mamba_ratio: int
    slots: int  # max_mamba_cache_size per DP rank
    intermediate_gib: float  # speculative decoding's intermediate states
    kv_budget_gib: float


@dataclass(frozen=True, slots=True)
class _ResolvedPools:
    """What the model runner and the scheduler size once the weights are loaded."""

    available: _AvailableMemory
    cells: _CellSizes
    state: _StateCache
    kv_pool_tokens: int  # max_total_num_tokens per DP rank
    max_running_requests: int  # effective, per DP rank
    max_req_input_len: int


@dataclass(frozen=True, slots=True)
class _KvUsage:
    kv_cache_gib: float
    available_after_gib: float  # free after the KV pool is allocated (SGLang's available_gpu_mem)


# ---------------------------------------------------------------------------------------------------------------
# The steps, in SGLang's start-up order (each warning lands in the log where SGLang logs it)
# ---------------------------------------------------------------------------------------------------------------


def _merge_args(
    args: Mapping[str, Any], env: Mapping[str, str] | None, extra_spec_algorithms: Iterable[str] | None
) -> _Start:
    """Merge `args` over SGLang's defaults and take out the emulator's `sim_*` settings (GPU, version, forks)."""
    version = str(args.get("sim_sglang_version") or "0.5.23")
    server_args = _arg_defaults(version)
    for k, v in args.items():
        if v is not None or k not in server_args:
            server_args[k] = v
    # SGLang before 0.5.15 names this flag --mamba-scheduler-strategy; both set the same dest.
    old_name = server_args.pop("mamba_scheduler_strategy", None)
    if args.get("mamba_scheduler_strategy") is not None or server_args["mamba_radix_cache_strategy"] is None:
        server_args["mamba_radix_cache_strategy"] = old_name
    # None from 0.5.20 on, resolved to 0.9 (mem_cache/kv_cache_configurator.py); earlier versions default to 0.9
    server_args["mamba_full_memory_ratio"] = (
        0.9 if server_args["mamba_full_memory_ratio"] is None else server_args["mamba_full_memory_ratio"]
    )
    if not server_args.get("model_path"):
        raise ValueError("--model-path is required")
    server_args.pop("sim_sglang_version", None)
    gpu = get_gpu(server_args.pop("sim_gpu", None))
    extra = {s.upper() for s in (extra_spec_algorithms or ())}
    more = server_args.pop("sim_extra_spec_algorithms", None) or ()
    if isinstance(more, str):
        more = more.split(",")
    extra |= {str(s).strip().upper() for s in more if str(s).strip()}
    for k in [k for k in server_args if k.startswith("sim_")]:
        server_args.pop(k)
    return _Start(
        server_args=server_args,
        env=dict(env or {}),
        sglang_version=version,
        version=_version_tuple(version),
        gpu=gpu,
        arch=load_model_arch(server_args["model_path"]),
        extra_spec_algorithms=frozenset(extra),
    )


def _check_parallelism(
    tp_size: Any, dp_size: Any, pp_size: Any, *, arch: ModelArch, env: Mapping[str, str],
    version: tuple[int, ...], log: _StartupLog,
) -> _Parallelism:
    """tp/dp sizes, and the attention heads tp must divide; notes SGLANG_ENABLE_SPEC_V2, which 0.5.15 removed."""
    if "SGLANG_ENABLE_SPEC_V2" in env and version >= (0, 5, 15):
        # arg_groups/speculative_hook.py: setting it only logs a notice (reference §0)
        log.warn(
            "SGLANG_ENABLE_SPEC_V2 has been removed; it has no effect. Use --disable-overlap-schedule to turn spec v2 off."
        )
    tp, dp, pp = int(tp_size or 1), int(dp_size or 1), int(pp_size or 1)
    if tp < 1 or dp < 1:
        raise ValueError(f"--tp-size and --dp-size must be >= 1 (got tp={tp}, dp={dp})")
    if arch.num_heads % tp:
        raise ValueError(
            f"Total number of attention heads ({arch.num_heads}) must be divisible by tensor parallel size ({tp})."
        )
    return _Parallelism(tp=tp, dp=dp, pp=pp)


def _resolve_spec_algorithm(asked: Any, extra_spec_algorithms: frozenset[str]) -> str | None:
    """The algorithm's name (srt/speculative/spec_info.py::SpeculativeAlgorithm.from_string; NEXTN runs as EAGLE)."""
    if not asked:
        return None
    name = str(asked).upper()
    if name not in BUILTIN_SPEC_ALGORITHMS and name not in extra_spec_algorithms:
        raise ValueError(f"Unknown speculative algorithm name: {asked}")
    return "EAGLE" if name == "NEXTN" else name


def _resolve_spec_budget(
    algorithm: str | None, *, arch: ModelArch, extra_spec_algorithms: frozenset[str], num_steps: Any,
    eagle_topk: Any, num_draft_tokens: Any, dflash_block_size: Any, draft_model_path: Any,
    ngram_max_bfs_breadth: Any, log: _StartupLog,
) -> _SpecBudget:
    """Steps, top-k and draft tokens per algorithm (speculative_hook.py), and the tokens the EAGLE family reserves."""
    steps, topk, draft = num_steps, eagle_topk, num_draft_tokens
    if algorithm in ("DFLASH", "DSPARK"):
        steps, topk = 1, 1
        if draft is None:
            draft = int(dflash_block_size or 16)
        if algorithm == "DFLASH" and not draft_model_path:
            raise ValueError("DFLASH speculative decoding requires --speculative-draft-model-path")
    elif algorithm == "NGRAM":
        steps = steps or 1
        topk = topk or int(ngram_max_bfs_breadth or 10)
        draft = draft or 12
    elif algorithm is not None and algorithm in extra_spec_algorithms:
        # A forked algorithm (e.g. DDTREE): its budget is num_draft_tokens; steps/topk are passed through.
        steps = steps or 1
        topk = topk or 1
        draft = draft or 16
    elif algorithm is not None:
        steps, topk, draft = _eagle_budget(algorithm, arch, steps, topk, draft, log)
    if algorithm is None:
        steps = topk = draft = None
    reserved = max(int(topk or 0) * int(steps or 0), int(draft or 0)) if algorithm in EAGLE_FAMILY else 0
    return _SpecBudget(num_steps=steps, eagle_topk=topk, num_draft_tokens=draft, reserved_tokens=reserved)


def _eagle_budget(
    algorithm: str, arch: ModelArch, steps: Any, topk: Any, draft: Any, log: _StartupLog
) -> tuple[int, int, int]:
    """EAGLE-style budgets: the defaults fill what is not given; with top-k 1 the draft is steps + 1."""
    draft_given = draft is not None
    d_steps, d_topk, d_draft = _spec_defaults(algorithm, arch)
    if steps is None and topk is None and draft is None:
        steps, topk, draft = d_steps, d_topk, d_draft
    else:
        steps = d_steps if steps is None else int(steps)
        topk = d_topk if topk is None else int(topk)
        draft = d_draft if draft is None else int(draft)
    if topk == 1 and draft != steps + 1:
        if draft_given:
            log.warn(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                "speculative_eagle_topk == 1"
            )
        draft = steps + 1
    return steps, topk, draft


def _reset_running_requests_for_spec(
    algorithm: str | None, max_running_requests: Any, log: _StartupLog
) -> int | None:
    """server_args.py::_handle_speculative_decoding: any spec algorithm sets an unset max_running_requests to 48."""
    if algorithm is not None and max_running_requests is None:
        log.warn(
            "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
            "setting --max-running-requests."
        )
        return SPEC_MAX_RUNNING_REQUESTS
    return max_running_requests


def _resolve_context_length(
    asked: Any, *, arch: ModelArch, env: Mapping[str, str], log: _StartupLog
) -> _ContextLength:
    """srt/configs/model_config.py::_derive_context_length: above the model's maximum only with the override."""
    derived = arch.max_position_embeddings
    if asked is None:
        return _ContextLength(asked=None, resolved=derived)
    asked = int(asked)
    if asked > derived:
        if not _env_true(env, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
            raise ValueError(context_length_error(asked, derived))
        log.warn(context_length_error(asked, derived).split(" To allow")[0])
    return _ContextLength(asked=asked, resolved=asked)


def _resolve_mamba_strategy(
    *, arch: ModelArch, version: tuple[int, ...], spec_algorithm: str | None, disable_radix_cache: Any,
    mamba_radix_cache_strategy: Any, disable_overlap_schedule: Any, page_size: Any,
) -> _CacheLayout:
    """Hybrid models' radix cache strategy (arg_groups/overrides.py::_mamba_radix_cache_resolution) and page size."""
    radix = not bool(disable_radix_cache)
    strategy: str | None = None
    if arch.is_hybrid:
        strategy = str(mamba_radix_cache_strategy or "auto")
        if strategy == "auto":
            if version >= (0, 5, 15) and (not disable_overlap_schedule or (page_size or 1) > 1):
                strategy = "extra_buffer"
            else:
                strategy = "no_buffer"
        if strategy == "no_buffer":
            disable_overlap_schedule = True
            page_size = 1
            if spec_algorithm is not None and radix and version <= (0, 5, 12):
                arch_name = arch.architectures[0] if arch.architectures else arch.name
                raise ValueError(
                    f"Speculative decoding for {arch_name} is not compatible with radix cache when using "
                    f"--mamba-scheduler-strategy no_buffer. To use radix cache with speculative decoding, please "
                    f"use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
                )
    return _CacheLayout(
        radix_cache=radix,
        mamba_strategy=strategy,
        disable_overlap_schedule=disable_overlap_schedule,
        page_size=int(page_size or 1),
    )


def _resolve_memory_defaults(
    *, gpu: GpuProfile, parallelism: _Parallelism, chunked_prefill_size: Any, max_prefill_tokens: Any,
    cuda_graph_max_bs: Any, cuda_graph_max_bs_decode: Any, max_running_requests: int | None,
    mem_fraction_static: Any,
) -> _MemoryDefaults:
    """Chunked prefill, CUDA graph batch and mem_fraction_static defaults from GPU memory (memory_hook.py)."""
    gpu_mem = gpu.memory_mib
    chunk = default_chunked_prefill_size(gpu_mem) if chunked_prefill_size is None else int(chunked_prefill_size)
    max_prefill = int(max_prefill_tokens or 16384)
    graph_bs = cuda_graph_max_bs
    if graph_bs is None:
        graph_bs = cuda_graph_max_bs_decode  # its name from SGLang 0.5.15 on
    graph_bs = default_cuda_graph_max_bs(gpu_mem, parallelism.tp) if graph_bs is None else int(graph_bs)
    if max_running_requests is not None:
        graph_bs = min(graph_bs, int(max_running_requests))
    frac = mem_fraction_static
    if frac is None:
        frac = auto_mem_fraction_static(
            gpu_mem, chunk if chunk > 0 else max_prefill, parallelism.tp, graph_bs, parallelism.pp
        )
    frac = float(frac)
    if not 0 < frac < 1:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {frac}")
    return _MemoryDefaults(
        chunked_prefill_size=chunk, max_prefill_tokens=max_prefill, cuda_graph_max_bs=graph_bs,
        mem_fraction_static=frac,
    )


def _profile_available_memory(
    *, gpu: GpuProfile, arch: ModelArch, tp: int, spec_algorithm: str | None, draft_model_path: Any,
    mem_fraction_static: float,
) -> _AvailableMemory:
    """model_executor/model_runner_kv_cache_mixin.py::_profile_available_bytes: what the weights leave for caches,
    rest = post_load_free - pre_load_free * (1 - mem_fraction_static) = frac * pre_load_free - weights."""
    pre_load_gib = gpu.memory_mib / 1024 - runtime_overhead_gib(tp)  # free after CUDA context and NCCL init
    weights = weight_bytes_per_rank(arch, tp)
    draft_weights = draft_weight_bytes_per_rank(spec_algorithm, arch, draft_model_path, tp)
    rest_gib = mem_fraction_static * pre_load_gib - (weights + draft_weights) / GiB
    if rest_gib <= 0:
        raise RuntimeError(
            f"Not enough memory. Please try to increase --mem-fraction-static. (weights {weights / GiB:.2f} GiB "
            f"per rank on {gpu.name} with {gpu.memory_mib / 1024:.1f} GiB, mem_fraction_static={mem_fraction_static})"
        )
    return _AvailableMemory(
        pre_load_free_gib=pre_load_gib, weight_bytes=weights, draft_weight_bytes=draft_weights,
        cache_budget_gib=rest_gib,
    )


def _size_cells(*, arch: ModelArch, tp: int, kv_cache_dtype: Any, mamba_ssm_dtype: Any) -> _CellSizes:
    """Bytes per KV token and per state slot (model_executor/pool_configurator.py::_compute_cell_size)."""
    kv_dtype = str(kv_cache_dtype or "auto")
    return _CellSizes(
        kv_cache_dtype=kv_dtype,
        kv_bytes_per_token=kv_bytes_per_token(arch, tp, kv_dtype),
        state_slot_bytes=state_slot_bytes(arch, tp, mamba_ssm_dtype),
    )


def _allocate_state_slots(
    *, arch: ModelArch, cache: _CacheLayout, spec_algorithm: str | None, num_draft_tokens: int | None,
    max_running_requests: int | None, max_mamba_cache_size: Any, mamba_full_memory_ratio: Any, dp: int,
    slot_bytes: int, cache_budget_gib: float,
) -> _StateCache:
    """Hybrid models: recurrent-state slots (and spec's intermediate state) come out of the rest before the KV pool
    (mem_cache/kv_cache_configurator.py::_handle_max_mamba_cache)."""
    if not arch.is_hybrid:
        return _StateCache(mamba_ratio=0, slots=0, intermediate_gib=0.0, kv_budget_gib=cache_budget_gib)
    ratio_m = calculate_mamba_ratio(cache.radix_cache, cache.mamba_strategy, bool(cache.disable_overlap_schedule))
    draft = int(num_draft_tokens or 0) if spec_algorithm else 0
    intermediate_gib = 0.0
    if max_mamba_cache_size is not None:
        slots = int(max_mamba_cache_size) // dp
        if spec_algorithm:
            capped = min(int(max_running_requests) // dp, slots // ratio_m)  # type: ignore[arg-type]
            intermediate_gib = slot_bytes * capped * draft / GiB
    elif not cache.radix_cache and max_running_requests is not None:
        slots = int(max_running_requests) // dp
        if spec_algorithm:
            intermediate_gib = slot_bytes * slots * draft / GiB
    else:
        # mamba : KV = ratio : 1 (mamba_full_memory_ratio, 0.9 by default)
        ratio = float(mamba_full_memory_ratio)
        budget = cache_budget_gib * ratio / (1 + ratio) * GiB
        if spec_algorithm:
            slots = int(budget // (slot_bytes * (1 + draft / ratio_m)))
            capped = min(int(max_running_requests) // dp, slots // ratio_m)  # type: ignore[arg-type]
            intermediate_gib = slot_bytes * capped * draft / GiB
        else:
            slots = int(budget // slot_bytes)
    if slots <= 0:
        raise RuntimeError(
            "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Try: (1) reduce "
            "--max-running-requests, (2) increase --mem-fraction-static, (3) reduce "
            "--speculative-num-draft-tokens, or (4) use GPUs with more memory."
        )
    return _StateCache(
        mamba_ratio=ratio_m,
        slots=slots,
        intermediate_gib=intermediate_gib,
        kv_budget_gib=cache_budget_gib - intermediate_gib - slots * slot_bytes / GiB,
    )


def _allocate_kv_pool(
    *, kv_budget_gib: float, kv_bytes_per_token: float, max_total_tokens: Any, page_size: int, log: _StartupLog
) -> int:
    """The KV pool in tokens: what is left over the per-token KV bytes, capped by --max-total-tokens, whole pages."""
    tokens = int(kv_budget_gib * GiB // kv_bytes_per_token)
    if tokens <= 0:
        raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    if max_total_tokens is not None:
        cap = int(max_total_tokens)
        if cap > tokens:
            log.warn(
                f"max_total_tokens={cap} is larger than the profiled value {tokens}. Use the profiled value instead."
            )
        tokens = min(tokens, cap)
    return tokens // page_size * page_size


def _resolve_max_running_requests(
    *, kv_pool_tokens: int, context_len: int, max_running_requests: int | None, dp: int, arch: ModelArch,
    state: _StateCache, log: _StartupLog,
) -> int:
    """kv_cache_configurator.py::resolve_max_num_reqs: per DP rank, bounded by the KV pool and the state slots."""
    estimated = max(min(int(kv_pool_tokens / context_len * 512), 4096), 2048)
    requested: int | None = None
    if max_running_requests is not None:
        requested = int(max_running_requests) // dp
        mrr = min(requested, kv_pool_tokens // 2)
    else:
        mrr = min(estimated, kv_pool_tokens // 2)
    if arch.is_hybrid:
        cap_m = state.slots // state.mamba_ratio
        if cap_m < mrr:
            log.warn(
                f"max_running_requests is capped to {cap_m} by the mamba state cache "
                f"(max_mamba_cache_size={state.slots}, mamba_ratio={state.mamba_ratio})."
            )
        mrr = min(mrr, cap_m)
        if mrr <= 0:
            raise RuntimeError(
                f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                f"max_mamba_cache_size={state.slots}, mamba_ratio={state.mamba_ratio}, resulting max_num_reqs={mrr}."
            )
    if requested is not None and mrr < requested:
        log.warn(
            f"max_running_requests was reduced from the requested {requested} to {mrr} (per dp worker) due to the "
            f"available KV cache capacity."
        )
    return mrr


def _resolve_max_input_len(*, context_len: int, kv_pool_tokens: int, log: _StartupLog) -> int:
    """managers/tp_worker.py: max_req_input_len = min(context_len - 1, kv_capacity - 1) - 5."""
    if kv_pool_tokens < context_len:
        log.warn(
            f"KV pool holds {kv_pool_tokens} tokens, fewer than --context-length {context_len}: longer prompts are "
            f"rejected at runtime."
        )
    return min(context_len - 1, kv_pool_tokens - 1) - 5


def _kv_usage(*, pools: _ResolvedPools, mem_fraction_static: float) -> _KvUsage:
    """The KV pool's GiB and what is free once it is allocated (SGLang's available_gpu_mem)."""
    pre_load = pools.available.pre_load_free_gib
    kv_gib = pools.kv_pool_tokens * pools.cells.kv_bytes_per_token / GiB
    available_after = pre_load - mem_fraction_static * pre_load + max(0.0, pools.state.kv_budget_gib - kv_gib)
    return _KvUsage(kv_cache_gib=kv_gib, available_after_gib=available_after)


def _log_allocation(
    *, arch: ModelArch, memory: _MemoryDefaults, pools: _ResolvedPools, context_len: int, usage: _KvUsage,
    log: _StartupLog,
) -> None:
    """SGLang's start-up log lines for the weights, the state cache and the KV pool."""
    weights_gib, tokens, kv_gib = pools.available.weight_bytes / GiB, pools.kv_pool_tokens, usage.kv_cache_gib
    log.lines.append(
        f"Load weight end. type={arch.architectures[0] if arch.architectures else arch.model_type}, "
        f"dtype=torch.bfloat16, avail mem={pools.available.pre_load_free_gib - weights_gib:.2f} GB, "
        f"mem usage={weights_gib:.2f} GB."
    )
    if arch.is_hybrid:
        log.lines.append(
            f"Mamba Cache is allocated. max_mamba_cache_size: {pools.state.slots}, conv_state and ssm_state size: "
            f"{pools.state.slots * pools.cells.state_slot_bytes / GiB:.2f}GB"
        )
    log.lines.append(
        f"KV Cache is allocated. #tokens: {tokens}, K size: {kv_gib / 2:.2f} GB, V size: {kv_gib / 2:.2f} GB"
    )
    log.lines.append(
        f"max_total_num_tokens={tokens}, chunked_prefill_size={memory.chunked_prefill_size}, "
        f"max_prefill_tokens={memory.max_prefill_tokens}, max_running_requests={pools.max_running_requests}, "
        f"context_len={context_len}, available_gpu_mem={usage.available_after_gib:.2f} GB"
    )


# ---------------------------------------------------------------------------------------------------------------
# The phases: the steps in order, and the one place each resolved value is written back into the server args
# ---------------------------------------------------------------------------------------------------------------


def _resolve_args(start: _Start, log: _StartupLog) -> _ResolvedArgs:
    """ServerArgs' post-init hooks and the model config, before the model loads; writes the resolved flags back."""
    sa, arch = start.server_args, start.arch
    parallelism = _check_parallelism(
        sa["tp_size"], sa["dp_size"], sa.get("pp_size"), arch=arch, env=start.env, version=start.version, log=log
    )
    spec_asked = sa.get("speculative_algorithm")
    algorithm = _resolve_spec_algorithm(spec_asked, start.extra_spec_algorithms)
    spec = _resolve_spec_budget(
        algorithm,
        arch=arch,
        extra_spec_algorithms=start.extra_spec_algorithms,
        num_steps=sa["speculative_num_steps"],
        eagle_topk=sa["speculative_eagle_topk"],
        num_draft_tokens=sa["speculative_num_draft_tokens"],
        dflash_block_size=sa.get("speculative_dflash_block_size"),
        draft_model_path=sa.get("speculative_draft_model_path"),
        ngram_max_bfs_breadth=sa.get("speculative_ngram_max_bfs_breadth"),
        log=log,
    )
    sa["speculative_algorithm"] = algorithm
    sa["speculative_num_steps"] = spec.num_steps
    sa["speculative_eagle_topk"] = spec.eagle_topk
    sa["speculative_num_draft_tokens"] = spec.num_draft_tokens
    max_running_requests = _reset_running_requests_for_spec(algorithm, sa["max_running_requests"], log)
    sa["max_running_requests"] = max_running_requests
    context = _resolve_context_length(sa["context_length"], arch=arch, env=start.env, log=log)
    cache = _resolve_mamba_strategy(
        arch=arch,
        version=start.version,
        spec_algorithm=algorithm,
        disable_radix_cache=sa["disable_radix_cache"],
        mamba_radix_cache_strategy=sa["mamba_radix_cache_strategy"],
        disable_overlap_schedule=sa["disable_overlap_schedule"],
        page_size=sa["page_size"],
    )
    sa["disable_overlap_schedule"] = cache.disable_overlap_schedule
    if arch.is_hybrid:
        sa["mamba_radix_cache_strategy"] = cache.mamba_strategy
    sa["page_size"] = cache.page_size
    memory = _resolve_memory_defaults(
        gpu=start.gpu,
        parallelism=parallelism,
        chunked_prefill_size=sa["chunked_prefill_size"],
        max_prefill_tokens=sa["max_prefill_tokens"],
        cuda_graph_max_bs=sa.get("cuda_graph_max_bs"),
        cuda_graph_max_bs_decode=sa.get("cuda_graph_max_bs_decode"),
        max_running_requests=max_running_requests,
        mem_fraction_static=sa["mem_fraction_static"],
    )
    sa["chunked_prefill_size"] = memory.chunked_prefill_size
    sa["cuda_graph_max_bs"] = memory.cuda_graph_max_bs
    sa["mem_fraction_static"] = memory.mem_fraction_static
    return _ResolvedArgs(
        parallelism=parallelism,
        spec_algorithm_asked=spec_asked,
        spec_algorithm=algorithm,
        spec=spec,
        max_running_requests=max_running_requests,
        context=context,
        cache=cache,
        memory=memory,
    )


def _resolve_pools(start: _Start, resolved: _ResolvedArgs, log: _StartupLog) -> _ResolvedPools:
    """The model runner's memory profile, state slots and KV pool, then the scheduler's limits; writes them back."""
    sa, arch, tp, dp = start.server_args, start.arch, resolved.parallelism.tp, resolved.parallelism.dp
    available = _profile_available_memory(
        gpu=start.gpu,
        arch=arch,
        tp=tp,
        spec_algorithm=resolved.spec_algorithm,
        draft_model_path=sa.get("speculative_draft_model_path"),
        mem_fraction_static=resolved.memory.mem_fraction_static,
    )
    cells = _size_cells(arch=arch, tp=tp, kv_cache_dtype=sa["kv_cache_dtype"], mamba_ssm_dtype=sa.get("mamba_ssm_dtype"))
    state = _allocate_state_slots(
        arch=arch,
        cache=resolved.cache,
        spec_algorithm=resolved.spec_algorithm,
        num_draft_tokens=resolved.spec.num_draft_tokens,
        max_running_requests=resolved.max_running_requests,
        max_mamba_cache_size=sa["max_mamba_cache_size"],
        mamba_full_memory_ratio=sa["mamba_full_memory_ratio"],
        dp=dp,
        slot_bytes=cells.state_slot_bytes,
        cache_budget_gib=available.cache_budget_gib,
    )
    if arch.is_hybrid:
        sa["max_mamba_cache_size"] = state.slots
    tokens = _allocate_kv_pool(
        kv_budget_gib=state.kv_budget_gib,
        kv_bytes_per_token=cells.kv_bytes_per_token,
        max_total_tokens=sa["max_total_tokens"],
        page_size=resolved.cache.page_size,
        log=log,
    )
    context_len = resolved.context.resolved
    max_running_requests = _resolve_max_running_requests(
        kv_pool_tokens=tokens,
        context_len=context_len,
        max_running_requests=resolved.max_running_requests,
        dp=dp,
        arch=arch,
        state=state,
        log=log,
    )
    max_req_input_len = _resolve_max_input_len(context_len=context_len, kv_pool_tokens=tokens, log=log)
    # The resolved args as SGLang's server args show them; max_running_requests stays as set (48 under spec).
    sa["tp_size"], sa["dp_size"] = tp, dp
    sa["context_length"] = resolved.context.asked
    sa["kv_cache_dtype"] = cells.kv_cache_dtype
    return _ResolvedPools(
        available=available,
        cells=cells,
        state=state,
        kv_pool_tokens=tokens,
        max_running_requests=max_running_requests,
        max_req_input_len=max_req_input_len,
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
    start = _merge_args(args, env, extra_spec_algorithms)
    log = _StartupLog()
    resolved = _resolve_args(start, log)
    pools = _resolve_pools(start, resolved, log)
    usage = _kv_usage(pools=pools, mem_fraction_static=resolved.memory.mem_fraction_static)
    _log_allocation(
        arch=start.arch, memory=resolved.memory, pools=pools, context_len=resolved.context.resolved, usage=usage,
        log=log,
    )
    return _resolved_server(start, resolved, pools, usage, log)


def _memory_usage(
    arch: ModelArch, resolved: _ResolvedArgs, pools: _ResolvedPools, usage: _KvUsage
) -> dict[str, Any]:
    """/server_info's memory_usage (GiB per rank)."""
    out: dict[str, Any] = {
        "weight": round((pools.available.weight_bytes + pools.available.draft_weight_bytes) / GiB, 2),
        "kvcache": round(usage.kv_cache_gib, 2),
        "startup_available": round(usage.available_after_gib, 2),
        "token_capacity": pools.kv_pool_tokens,
        "token_capacity_swa": None,
        "graph": {"decode": round(resolved.memory.cuda_graph_max_bs * 2 / 1024, 2)},
    }
    if arch.is_hybrid:
        out["mamba"] = round(
            pools.state.slots * pools.cells.state_slot_bytes / GiB + pools.state.intermediate_gib, 2
        )
    return out


def _resolved_server(
    start: _Start, resolved: _ResolvedArgs, pools: _ResolvedPools, usage: _KvUsage, log: _StartupLog
) -> ResolvedServer:
    sa = start.server_args
    return ResolvedServer(
        args=sa,
        arch=start.arch,
        gpu=start.gpu,
        tp_size=resolved.parallelism.tp,
        dp_size=resolved.parallelism.dp,
        context_len=resolved.context.resolved,
        max_total_num_tokens=pools.kv_pool_tokens,
        max_req_input_len=pools.max_req_input_len,
        effective_max_running_requests=pools.max_running_requests,
        max_queued_requests=None if sa["max_queued_requests"] is None else int(sa["max_queued_requests"]),
        chunked_prefill_size=resolved.memory.chunked_prefill_size,
        max_prefill_tokens=resolved.memory.max_prefill_tokens,
        page_size=resolved.cache.page_size,
        kv_bytes_per_token=pools.cells.kv_bytes_per_token,
        state_slot_bytes=pools.cells.state_slot_bytes,
        state_slots=pools.state.slots,
        mem_fraction_static=resolved.memory.mem_fraction_static,
        memory_usage=_memory_usage(start.arch, resolved, pools, usage),
        spec_algorithm=resolved.spec_algorithm,
        spec_algorithm_asked=str(resolved.spec_algorithm_asked).upper() if resolved.spec_algorithm_asked else None,
        spec_num_steps=resolved.spec.num_steps,
        spec_eagle_topk=resolved.spec.eagle_topk,
        spec_num_draft_tokens=resolved.spec.num_draft_tokens,
        num_reserved_tokens=resolved.spec.reserved_tokens,
        radix_cache=resolved.cache.radix_cache,
        mamba_radix_cache_strategy=resolved.cache.mamba_strategy,
        sglang_version=start.sglang_version,
        log_lines=log.lines,
        warnings=log.warnings,
        mamba_ratio=pools.state.mamba_ratio,
    )


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
