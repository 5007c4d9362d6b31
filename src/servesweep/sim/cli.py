"""`servesweep sim` / `python -m servesweep.sim`: SGLang's `launch_server` flags, parsed as SGLang parses them.

The flag set depends on the emulated SGLang version (`--sim-sglang-version`, reference sglang.md §0): the mamba
strategy flag and the CUDA-graph batch-size flag were renamed, and `--speculative-algorithm` was a closed choice
list up to 0.5.10. argparse prefix matching stays on, as in SGLang, so `--tp 4` and `--speculative-algo NEXTN` work
and an ambiguous prefix (`--cuda-graph-max-bs` on 0.5.20+) fails the way SGLang fails. Emulator-only flags all
start with `--sim-`.
"""

from __future__ import annotations

import argparse
import re
import sys

import click

DEFAULT_SGLANG_VERSION = "0.5.23"
KNOWN_VERSIONS = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.15.post1", "0.5.20", "0.5.23")

OLD_SPEC_CHOICES = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]
ATTENTION_BACKENDS = (
    "triton torch_native flex_attention dsa nsa qsa dsv4 compressed fa3 fa4 flashinfer llada2_cfg_flashinfer "
    "flashmla trtllm_mla cutedsl_mla tokenspeed_mla trtllm_mha hpc_ops minicpm_flashattn minicpm_flashinfer aiter "
    "wave intel_amx ascend intel_xpu"
).split()
SCHEDULE_POLICIES = ["fcfs", "lpm", "random", "dfs-weight", "lof", "priority", "routing-key"]
REASONING_PARSERS = [
    "auto", "deepseek-r1", "deepseek-v3", "glm45", "gpt-oss", "kimi", "kimi_k2", "minimax", "minimax-append-think",
    "qwen3", "qwen3-thinking", "step3", "nano_v3", "interns1",
]  # fmt: skip


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.5.15.post1' -> (0, 5, 15, 1); used only for ordering versions."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?", v.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"--sim-sglang-version {v!r}: expected a version like 0.5.23 or 0.5.15.post1 (known: "
            f"{', '.join(KNOWN_VERSIONS)})"
        )
    return tuple(int(g or 0) for g in m.groups())


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT]i?)")
_DEC = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """`128k` -> 128000, `32K`/`32Ki` -> 32768, `1M` -> 1048576, plain integers as themselves.

    Lower-case suffixes are decimal, upper-case (and `Ki`-style) ones binary, as SGLang's `human_readable_int`.
    """
    value = value.strip()
    m = _HUMAN_INT.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix.endswith("i") or suffix in _BIN:
            try:
                return int(number) * _BIN[suffix[0].upper()]
            except ValueError as e:
                raise argparse.ArgumentTypeError(
                    f"decimals are not allowed with binary suffixes like {suffix}: {value!r}"
                ) from e
        return int(float(number) * _DEC[suffix])
    try:
        return int(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid integer {value!r} (use e.g. 131072, 128k or 32Ki)") from e


def _fault_rates(value: str) -> dict[str, float]:
    from .faults import parse_fault_rates

    try:
        return parse_fault_rates(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _calibration(value: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        key, sep, num = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"--sim-calibration: {part!r} is not KEY=VALUE")
        try:
            out[key.strip()] = float(num)
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"--sim-calibration: {key.strip()}={num!r} is not a number"
            ) from e
    return out


def _csv_upper(value: str) -> list[str]:
    return [p.strip().upper() for p in value.split(",") if p.strip()]


def build_parser(version: str = DEFAULT_SGLANG_VERSION) -> argparse.ArgumentParser:
    """The `launch_server` parser of SGLang `version` plus the emulator's `--sim-*` flags."""
    v = version_tuple(version)
    p = argparse.ArgumentParser(
        prog="servesweep sim",
        description="SGLang emulator: an SGLang-compatible HTTP server whose timing comes from a simulated GPU.",
        allow_abbrev=True,
    )
    a = p.add_argument
    # model
    a("--model-path", "--model", dest="model_path", required=True, help="HF id or local directory")
    a("--tokenizer-path", default=None)
    a("--tokenizer-mode", default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", default="auto")
    a("--trust-remote-code", action="store_true")
    a("--dtype", default="auto")
    a("--quantization", default=None)
    a("--context-length", type=human_readable_int, default=None)
    a("--served-model-name", default=None)
    a("--chat-template", default=None)
    a("--revision", default=None)
    a("--json-model-override-args", default="{}")
    a("--weight-version", default="default")
    a("--is-embedding", action="store_true")
    # parallelism
    a("--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--ep-size", "--expert-parallel-size", dest="ep_size", type=int, default=1)
    a("--attn-dp-size", type=int, default=None)
    a("--enable-dp-attention", action="store_true")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--device", default=None)
    # memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=human_readable_int, default=None)
    a("--max-queued-requests", type=human_readable_int, default=None)
    a("--max-total-tokens", type=human_readable_int, default=None)
    a("--chunked-prefill-size", type=human_readable_int, default=None)
    a("--max-prefill-tokens", type=human_readable_int, default=16384)
    a("--page-size", type=int, default=None)
    a("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    a("--schedule-policy", default="fcfs", choices=SCHEDULE_POLICIES)
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--enable-mixed-chunk", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-priority-scheduling", action="store_true")
    a("--disable-radix-cache", action="store_true")
    a("--radix-eviction-policy", default="lru", choices=["lru", "lfu"])
    a("--enable-hierarchical-cache", action="store_true")
    a("--cpu-offload-gb", type=int, default=0)
    # attention / graphs
    a("--attention-backend", default=None, choices=ATTENTION_BACKENDS)
    a("--prefill-attention-backend", default=None, choices=ATTENTION_BACKENDS)
    a("--decode-attention-backend", default=None, choices=ATTENTION_BACKENDS)
    a("--linear-attn-backend", default="triton")
    a("--disable-cuda-graph", action="store_true")
    a("--enable-torch-compile", action="store_true")
    if v >= (0, 5, 15):
        a("--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs_decode", type=int, default=None)
        a("--cuda-graph-max-bs-prefill", dest="cuda_graph_max_bs_prefill", type=int, default=None)
        a("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
        a("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
        a("--cuda-graph-config", default=None)
        a("--disable-decode-cuda-graph", action="store_true")
        if v < (0, 5, 20):  # deprecated alias, an exact match so not ambiguous
            a("--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int, default=None)
    else:
        a("--cuda-graph-max-bs", dest="cuda_graph_max_bs", type=int, default=None)
        a("--cuda-graph-bs", type=int, nargs="+", default=None)
    # speculative decoding
    if v < (0, 5, 11):
        a("--speculative-algorithm", type=str.upper, default=None, choices=OLD_SPEC_CHOICES)
    else:  # a free string, checked by SpeculativeAlgorithm.from_string (here: hardware.resolve_server)
        a("--speculative-algorithm", type=str.upper, default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    a("--speculative-draft-model-revision", default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-accept-threshold-single", type=float, default=1.0)
    a("--speculative-accept-threshold-acc", type=float, default=1.0)
    a("--speculative-ngram-max-bfs-breadth", type=int, default=10)
    # hybrid (mamba / GDN) models
    strategies = ["auto", "no_buffer", "extra_buffer"]
    if v >= (0, 5, 15):
        a("--mamba-radix-cache-strategy", default="auto", choices=[*strategies, "extra_buffer_lazy"])
        if v < (0, 5, 20):
            a(
                "--mamba-scheduler-strategy",
                dest="mamba_radix_cache_strategy",
                choices=[*strategies, "extra_buffer_lazy"],
                help="deprecated alias of --mamba-radix-cache-strategy",
            )
    else:
        a("--mamba-scheduler-strategy", default="auto", choices=strategies)
    a("--mamba-full-memory-ratio", type=float, default=None)
    a("--max-mamba-cache-size", type=int, default=None)
    a("--mamba-ssm-dtype", default=None, choices=["float32", "bfloat16", "float16"])
    a("--mamba-track-interval", type=int, default=256)
    a("--mamba-backend", default="triton")
    # serving
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--api-key", default=None)
    a("--reasoning-parser", default=None, choices=REASONING_PARSERS)
    a("--tool-call-parser", default=None)
    a("--stream-interval", type=int, default=1)
    a("--stream-response-default-include-usage", action="store_true")
    a("--incremental-streaming-output", action="store_true")
    a("--allow-auto-truncate", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--watchdog-timeout", type=float, default=300)
    a("--skip-server-warmup", action="store_true")
    a("--warmups", default=None)
    a("--random-seed", type=int, default=None)
    a("--tokenizer-worker-num", type=int, default=1)
    # observability
    a("--enable-metrics", action="store_true")
    a("--enable-metrics-for-all-schedulers", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--log-level", default="info")
    a("--log-level-http", default=None)
    a("--log-requests", action="store_true")
    a("--log-requests-level", type=int, default=2)
    a("--show-time-cost", action="store_true")
    a("--bucket-time-to-first-token", type=float, nargs="+", default=None)
    a("--bucket-inter-token-latency", type=float, nargs="+", default=None)
    a("--bucket-e2e-request-latency", type=float, nargs="+", default=None)
    a("--prompt-tokens-buckets", nargs="+", default=None)
    a("--generation-tokens-buckets", nargs="+", default=None)
    a("--enable-trace", action="store_true")
    a("--config", default=None)
    # emulator-only
    s = p.add_argument_group("emulator (servesweep)")
    s.add_argument("--sim-gpu", default="H200", help="GPU profile: H200, H100, RTX-PRO-6000, A6000")
    s.add_argument("--sim-calibration", type=_calibration, default={}, help="step-model constants KEY=V,...")
    s.add_argument("--sim-seed", type=int, default=0)
    s.add_argument("--sim-load-time", type=float, default=0.3, help="seconds of simulated weight loading")
    s.add_argument("--sim-fault-rate", type=_fault_rates, default={}, help="KIND[:ARG]=P,... (seeded)")
    s.add_argument("--sim-ground-truth", default=None, help="append one JSON line per finished request here")
    s.add_argument(
        "--sim-extra-spec-algorithms", type=_csv_upper, default=[], help="DDTREE,... (forked builds)"
    )
    s.add_argument("--sim-sglang-version", default=DEFAULT_SGLANG_VERSION, help="SGLang version to emulate")
    return p


def config_file_args(path: str) -> list[str]:
    """`--config FILE` (SGLang's YAML config): `key: value` pairs become `--key value` flags placed before the
    command line's, so flags given on the command line win. `true` adds a bare flag, `false`/null leave it out,
    lists give several values. Keys may use dashes or underscores. Secrets such as `api-key` can live here."""
    from ruamel.yaml import YAML

    try:
        with open(path, encoding="utf-8") as f:
            data = YAML(typ="safe").load(f)
    except OSError as e:
        raise SystemExit(f"servesweep sim: error: --config {path}: {e.strerror}") from None
    except Exception as e:  # a YAML syntax error names its line
        raise SystemExit(f"servesweep sim: error: --config {path}: not valid YAML: {e}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise SystemExit(f"servesweep sim: error: --config {path}: expected a mapping of flag: value")
    out: list[str] = []
    for key, val in data.items():
        flag = "--" + str(key).replace("_", "-")
        if val is True:
            out.append(flag)
        elif val is False or val is None:
            continue
        elif isinstance(val, list):
            out += [flag, *map(str, val)]
        else:
            out += [flag, str(val)]
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse `argv` with the parser of the SGLang version it asks for (`--sim-sglang-version`, default 0.5.23)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-sglang-version", default=None)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    full = list(argv)
    if known.config:
        full = config_file_args(known.config) + full
        known, _ = pre.parse_known_args(full)
    version = known.sim_sglang_version or DEFAULT_SGLANG_VERSION
    try:
        version_tuple(version)
    except argparse.ArgumentTypeError as e:
        build_parser().error(str(e))
    ns = build_parser(version).parse_args(full)
    ns.launch_command = list(argv)  # as typed: values read from --config (secrets) stay out of /server_info
    return ns


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from .server import run_server

    return run_server(args)


@click.command(
    name="sim",
    context_settings=dict(ignore_unknown_options=True, allow_extra_args=True, help_option_names=[]),
    add_help_option=False,
)
@click.pass_context
def command(ctx: click.Context) -> None:
    """Run the SGLang emulator (takes SGLang's launch_server flags; --help lists them)."""
    sys.exit(main(list(ctx.args)))
