"""SGLang launch flags as an experiment file writes them (dest names): their types, the names SGLang renamed, the
ones servesweep sets itself, and the check and coercion of a server's `flags:` mapping."""

from __future__ import annotations

import difflib
import re
from typing import Any

_HUMAN_INT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|K|Ki|M|Mi)?\s*$")


def human_int(v: Any) -> int:
    """128k -> 128000, 32Ki -> 32768, 1M -> 1000000 (as SGLang's human_readable_int); ints pass through."""
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        m = _HUMAN_INT.match(v)
        if m:
            mult = {None: 1, "k": 1000, "K": 1000, "Ki": 1024, "M": 1_000_000, "Mi": 1 << 20}[m.group(2)]
            n = float(m.group(1)) * mult
            if n.is_integer():
                return int(n)
    raise ValueError(f"expected an integer (e.g. 4096, 128k, 32Ki), got {v!r}")


def did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --------------------------------------------------------------------------------------------------------------
# SGLang flags we know the type of (dest names, reference sglang.md §1). Other flags are accepted as they are
# (forked builds add their own), unless they are one typo away from a known one.
INT, FLOAT, STR, BOOL, HINT = "int", "float", "str", "bool", "hint"  # HINT: integer that accepts 128k / 32Ki
SGLANG_FLAGS: dict[str, str] = {
    "tp_size": INT,
    "dp_size": INT,
    "pp_size": INT,
    "attn_dp_size": INT,
    "ep_size": INT,
    "context_length": HINT,
    "mem_fraction_static": FLOAT,
    "max_running_requests": INT,
    "max_queued_requests": INT,
    "max_total_tokens": HINT,
    "chunked_prefill_size": HINT,
    "max_prefill_tokens": HINT,
    "page_size": INT,
    "kv_cache_dtype": STR,
    "attention_backend": STR,
    "prefill_attention_backend": STR,
    "decode_attention_backend": STR,
    "linear_attn_backend": STR,
    "speculative_algorithm": STR,
    "speculative_num_steps": INT,
    "speculative_eagle_topk": INT,
    "speculative_num_draft_tokens": INT,
    "speculative_draft_model_path": STR,
    "speculative_dflash_block_size": INT,
    "mamba_radix_cache_strategy": STR,
    "mamba_full_memory_ratio": FLOAT,
    "max_mamba_cache_size": INT,
    "mamba_ssm_dtype": STR,
    "mamba_track_interval": INT,
    "mamba_backend": STR,
    "disable_radix_cache": BOOL,
    "radix_eviction_policy": STR,
    "enable_metrics": BOOL,
    "enable_cache_report": BOOL,
    "served_model_name": STR,
    "tokenizer_path": STR,
    "reasoning_parser": STR,
    "tool_call_parser": STR,
    "stream_interval": INT,
    "stream_response_default_include_usage": BOOL,
    "allow_auto_truncate": BOOL,
    "watchdog_timeout": FLOAT,
    "skip_server_warmup": BOOL,
    "schedule_policy": STR,
    "disable_overlap_schedule": BOOL,
    "enable_mixed_chunk": BOOL,
    "trust_remote_code": BOOL,
    "cuda_graph_max_bs_decode": INT,
    "cuda_graph_max_bs_prefill": INT,
    "disable_cuda_graph": BOOL,
    "disable_decode_cuda_graph": BOOL,
    "json_model_override_args": STR,
    "quantization": STR,
    "dtype": STR,
    "load_format": STR,
    "random_seed": INT,
    "log_level": STR,
}
# Aliases and renamed flags -> the current dest name (sglang.md §0-1). The role renders version-specific names.
FLAG_ALIASES = {
    "tp": "tp_size",
    "tensor_parallel_size": "tp_size",
    "dp": "dp_size",
    "data_parallel_size": "dp_size",
    "mamba_scheduler_strategy": "mamba_radix_cache_strategy",
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
    "speculative_algo": "speculative_algorithm",
    "speculative_draft_model": "speculative_draft_model_path",
}
# Set by servesweep itself from other parts of the experiment; an experiment must not set them as flags.
RESERVED_FLAGS = {
    "model_path": "model.path",
    "host": "target.address",
    "port": "target.port",
    "api_key": "secrets",
}


def normalise_flags(plain: dict, problems: list) -> dict:
    """Map flag aliases to dest names and check flag values by type, wherever flags appear."""
    server = plain.get("server")
    if not isinstance(server, dict):
        return plain
    launcher = plain.get("launcher")
    # a generic server's flags are its own: no SGLang renames, types or did-you-mean against SGLang's names
    generic = isinstance(launcher, dict) and launcher.get("command") is not None

    def fix_flags(d: Any, loc: tuple, is_axis: bool) -> Any:
        if not isinstance(d, dict):
            return d
        out = {}
        for raw_key, val in d.items():
            key = raw_key.replace("-", "_")
            if not generic:
                key = FLAG_ALIASES.get(key, key)
            kloc = loc + (raw_key,)
            if key in RESERVED_FLAGS:
                problems.append(
                    (kloc, f"set by servesweep from {RESERVED_FLAGS[key]}; do not give it as a flag")
                )
                continue
            if key in out:
                problems.append((kloc, f"'{raw_key}' is the same flag as '{key}', given twice"))
                continue
            if key not in SGLANG_FLAGS and not generic:
                hint = did_you_mean(key, SGLANG_FLAGS)
                if hint:
                    problems.append((kloc, f"unknown SGLang flag '{raw_key}'{hint}"))
                    continue
            typ = None if generic else SGLANG_FLAGS.get(key)
            if is_axis:
                if not isinstance(val, list):
                    problems.append((kloc, f"expected a list of {_plural(typ)}, got {val!r}"))
                    continue
                vals = []
                for v in val:
                    ok, cv = _coerce(v, typ)
                    if not ok:
                        problems.append((kloc, f"expected a list of {_plural(typ)}, got {v!r}"))
                        break
                    vals.append(cv)
                else:
                    if not vals:
                        problems.append((kloc, "an axis needs at least one value"))
                    out[key] = vals
            else:
                ok, cv = _coerce(val, typ)
                if not ok:
                    problems.append((kloc, f"expected {_singular(typ)}, got {val!r}"))
                    continue
                out[key] = cv
        return out

    server = dict(server)
    if "base" in server:
        server["base"] = fix_flags(server["base"], ("server", "base"), False)
    if "axes" in server:
        server["axes"] = fix_flags(server["axes"], ("server", "axes"), True)
    if isinstance(server.get("bundles"), list):
        bundles = []
        for i, b in enumerate(server["bundles"]):
            if isinstance(b, dict) and "flags" in b:
                b = dict(b)
                b["flags"] = fix_flags(b["flags"], ("server", "bundles", i, "flags"), False)
            bundles.append(b)
        server["bundles"] = bundles
    return {**plain, "server": server}


def _plural(typ: str | None) -> str:
    return {INT: "integers", HINT: "integers", FLOAT: "numbers", STR: "strings", BOOL: "booleans"}.get(
        typ, "values"
    )


def _singular(typ: str | None) -> str:
    return {
        INT: "an integer",
        HINT: "an integer",
        FLOAT: "a number",
        STR: "a string",
        BOOL: "true or false",
    }.get(typ, "a value")


def _coerce(v: Any, typ: str | None) -> tuple[bool, Any]:
    if typ is None:
        ok = v is None or isinstance(v, str | int | float | bool | list | dict)
        return ok, v
    if v is None:
        return True, None  # None = leave the flag unset (SGLang's default)
    try:
        if typ == INT:
            if isinstance(v, bool) or not isinstance(v, int):
                return False, v
            return True, v
        if typ == HINT:
            return True, human_int(v)
        if typ == FLOAT:
            if isinstance(v, bool) or not isinstance(v, int | float):
                return False, v
            return True, float(v)
        if typ == BOOL:
            return isinstance(v, bool), v
        if typ == STR:
            return isinstance(v, str | int | float) and not isinstance(v, bool), str(v)
    except ValueError:
        return False, v
    return False, v
