"""A pure-torch stand-in for SGLang's CPU `sgl_kernel` extension, for the real-SGLang CPU tier only.

What it replaces: the `sgl_kernel` Python package of SGLang's CPU build (`sgl-kernel/csrc/cpu` in SGLang's
repository, package `sglang-kernel-cpu`). That build has no wheel; it compiles C++20 with AMX flags, CMake and
libnuma, and the `sgl-kernel`/`sglang-kernel` wheels of the index are CUDA builds that fail to import here
(`libnvrtc.so.12`). With `SGLANG_USE_CPU_ENGINE=1`, SGLang 0.5.23 imports `sgl_kernel` anyway:

- its compute kernels (RMSNorm, SiLU, RoPE, KV store, fused MoE, packed GEMMs) are registered as
  `torch.ops.sgl_kernel.*` and used only when `cpu_has_amx_support()` is true, which needs AMX tiles *and*
  `torch.ops.sgl_kernel.convert_weight_packed`. This module registers no torch op, so that check is false and
  SGLang takes its own pure-torch `forward_native` paths (attention: `--attention-backend torch_native`). A call
  to an unregistered op fails with torch's error naming `sgl_kernel::<op>`;
- a few bookkeeping helpers are imported by name on every CPU (`if _is_cpu: from sgl_kernel import ...`), so
  without a module of that name SGLang's scheduler does not even import. In 0.5.23 plain decoding calls none of
  them (checked by recording, see below): `assign_req_to_token_pool_cpu` (`srt/mem_cache/allocation.py`) is
  called only by `alloc_for_spec_decode`; it is implemented below anyway, with the semantics of SGLang's triton
  `assign_req_to_token_pool`, because it is plain bookkeeping. The others (speculative-decoding tree and
  cache-loc helpers, KV moves between layers) resolve to a function that raises NotImplementedError naming the
  helper, so a server path that needs one fails loudly, never silently.

It changes nothing SGLang computes for plain decoding: the HTTP layer, tokenizer manager, scheduler, radix cache,
detokenizer and metrics are SGLang's own. `tests/sglang_cpu/test_stand_in.py` fails when SGLang starts importing
or calling a helper this module does not implement.

Recording (for that test): with `SERVESWEEP_SGL_KERNEL_RECORD=<file>`, each lookup of a helper not implemented
here appends `lookup <name>` and each call of one appends `call <name>`; each call of an implemented helper
appends `call-ok <name>` once per process.
"""

from __future__ import annotations

import os

import torch

# What SGLang's CPU path may call, implemented here (the test compares SGLang's imports against this).
IMPLEMENTED = ("assign_req_to_token_pool_cpu",)

# Helpers SGLang 0.5.23 imports by name on a CPU but calls only on paths this tier does not run; the reason says
# which path. tests/sglang_cpu/test_stand_in.py requires every CPU-gated import to be here or in IMPLEMENTED.
NOT_NEEDED = {
    "copy_all_layer_kv_cache_cpu": "moves KV between pool slots (hierarchical cache / speculative decoding)",
    "rotate_input_ids_cpu": "multi-layer EAGLE speculative decoding",
    "fill_accept_out_cache_loc_cpu": "EAGLE speculative decoding (accepted tokens' cache slots)",
    "fill_bonus_tokens_cpu": "EAGLE speculative decoding (bonus tokens)",
    "assign_draft_cache_locs_contiguous_cpu": "speculative decoding (draft tokens' cache slots)",
    "assign_extend_cache_locs_cpu": "speculative decoding (verify step's cache slots)",
    "build_tree_kernel_efficient_cpu": "speculative decoding (draft tree)",
    "verify_tree_greedy_cpu": "speculative decoding (greedy tree verification)",
    "build_draft_decode_metadata_cpu": "the intel_amx attention backend (AMX only)",
    # imported when not on CUDA by two MoE modules (triton_kernels MoE, cutlass w4a8 MoE) that a dense model
    # such as the tier's Qwen2 never loads
    "silu_and_mul": "MoE activations (triton_kernels / cutlass w4a8 MoE layers)",
    "gelu_and_mul": "MoE activations (triton_kernels MoE layers)",
}

_RECORD = os.environ.get("SERVESWEEP_SGL_KERNEL_RECORD", "")
_recorded: set[str] = set()


def _record(line: str) -> None:
    if not _RECORD or line in _recorded:
        return
    _recorded.add(line)
    # one short O_APPEND write per line: the server's processes append to the same file without interleaving
    fd = os.open(_RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For each request i in order, write the next `end_offset[i] - start_offset[i]` entries of `out_cache_loc`
    into row `req_pool_indices[i]` of `req_to_token` (a row is `pool_len` long), columns start..end.

    Same semantics as SGLang's triton `assign_req_to_token_pool` (`srt/mem_cache/allocation.py`): request i reads
    `out_cache_loc` from the sum of the earlier requests' lengths; a length <= 0 writes nothing."""
    _record("call-ok assign_req_to_token_pool_cpu")
    flat = req_to_token.view(-1)  # the triton kernel addresses rows as base + row * pool_len
    pos = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        n = end - start
        if n > 0:
            base = row * pool_len
            flat[base + start : base + end] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def _not_implemented(name: str):
    def helper(*args, **kwargs):
        _record(f"call {name}")
        why = NOT_NEEDED.get(name, "not used by plain decoding on a CPU without AMX")
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by servesweep's pure-torch sgl_kernel stand-in "
            f"(src/servesweep/sglang/cpu/stand_in/sgl_kernel; SGLang uses it for: {why}). This tier runs plain "
            "decoding only; a server option that needs it cannot run on the CPU tier."
        )

    helper.__name__ = helper.__qualname__ = name
    return helper


def __getattr__(name: str):
    # Module-level `from sgl_kernel import x` must succeed for SGLang's modules to import at all; the helper
    # fails only when called. Dunder and private names stay missing (import machinery, hasattr probes).
    if name.startswith("_"):
        raise AttributeError(name)
    _record(f"lookup {name}")
    fn = _not_implemented(name)
    globals()[name] = fn
    return fn
