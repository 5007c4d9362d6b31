"""`servesweep sim` / `python -m servesweep.sim`: SGLang's launch-server flags, parsed by SGLang's own parser.

The parser is the emulated version's (`--sim-sglang-version`), built from that version's flag table
(servesweep.sglang.flags, read from SGLang's argparse): the same option strings, types, choices, defaults and
prefix matching, so `--tp 4` works and an ambiguous prefix (`--cuda-graph-max-bs` on 0.5.20+) fails the way SGLang
fails. Every flag of the version is accepted; the ones the emulator does not model are listed at start-up and in
`/server_info` (`sim_unmodeled_flags`). The emulator's own options all start with `--sim-`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from servesweep.sglang import flags
from servesweep.sglang.serverargs import RESOLVED_FLAGS

if TYPE_CHECKING:
    from .faults import Fault

DEFAULT_SGLANG_VERSION = "0.5.23"

# What the emulator models besides the memory and scheduling arithmetic (serverargs.RESOLVED_FLAGS): its HTTP
# server, streams, metrics and logs. A flag outside both is accepted and listed as not modeled.
SERVED_FLAGS = frozenset(
    {
        "host",
        "port",
        "api_key",
        "config",
        "served_model_name",
        "tokenizer_path",
        "weight_version",
        "load_format",
        "reasoning_parser",
        "tool_call_parser",
        "allow_auto_truncate",
        "stream_interval",
        "stream_response_default_include_usage",
        "enable_cache_report",
        "enable_metrics",
        "bucket_time_to_first_token",
        "bucket_inter_token_latency",
        "bucket_e2e_request_latency",
        "decode_log_interval",
        "log_level",
    }
)
MODELED_FLAGS = SERVED_FLAGS | frozenset(RESOLVED_FLAGS)


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.5.15.post1' -> (0, 5, 15, 1), for a version the emulator has SGLang's flag table of."""
    if v not in flags.table_versions():
        raise argparse.ArgumentTypeError(
            f"--sim-sglang-version {v!r}: no flag table for this SGLang version (tables: "
            f"{', '.join(flags.table_versions())})"
        )
    return flags.version_key(v)


def _fault_rates(value: str) -> dict[Fault, float]:
    from .faults import parse_fault_rates

    try:
        return parse_fault_rates(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _answer_fault(value: str):
    from .replies import parse_answer_fault

    try:
        return parse_answer_fault(value, "--sim-answer-fault")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _crawl(value: str) -> tuple[float, float]:
    from .faults import parse_crawl

    try:
        return parse_crawl(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        s = -1.0
    if not 0 <= s < float("inf"):
        raise argparse.ArgumentTypeError(f"--sim-hang-after: {value!r} is not a number of seconds ≥ 0")
    return s


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


def build_parser(
    version: str = DEFAULT_SGLANG_VERSION, extra_spec_algorithms: list[str] | tuple[str, ...] = ()
) -> argparse.ArgumentParser:
    """SGLang `version`'s launch-server parser plus the emulator's `--sim-*` options. A forked build's speculative
    algorithms (`extra_spec_algorithms`) join a closed `--speculative-algorithm` choice list (up to 0.5.11)."""
    p = flags.parser(
        version,
        prog="servesweep sim",
        description="SGLang emulator: an SGLang-compatible HTTP server whose timing comes from a simulated GPU.",
    )
    spec = next((x for x in p._actions if x.dest == "speculative_algorithm"), None)
    if spec is not None and spec.choices is not None and extra_spec_algorithms:
        spec.choices = [*spec.choices, *extra_spec_algorithms]
    s = p.add_argument_group("emulator (servesweep)")
    s.add_argument("--sim-gpu", default="H200", help="GPU profile: H200, H100, RTX-PRO-6000, A6000")
    s.add_argument("--sim-calibration", type=_calibration, default={}, help="step-model constants KEY=V,...")
    s.add_argument("--sim-seed", type=int, default=0)
    s.add_argument("--sim-load-time", type=float, default=0.3, help="seconds of simulated weight loading")
    s.add_argument("--sim-fault-rate", type=_fault_rates, default={}, help="KIND[:ARG]=P,... (seeded)")
    s.add_argument(
        "--sim-answer-fault",
        type=_answer_fault,
        default=None,
        help="loop[:N], wrong_past:T or spec_diverge[:N]: every answer of this server (a broken server)",
    )
    s.add_argument(
        "--sim-hang-after",
        type=_seconds,
        default=None,
        metavar="S",
        help="S seconds after ready the server hangs: connections accepted, nothing ever answered (/health too)",
    )
    s.add_argument(
        "--sim-crawl-after",
        type=_crawl,
        default=None,
        metavar="S:FACTOR",
        help="S seconds after ready every engine step becomes FACTOR times slower (e.g. 5:10)",
    )
    s.add_argument("--sim-ground-truth", default=None, help="append one JSON line per finished request here")
    s.add_argument(
        "--sim-gpu-throttle",
        choices=["none", "power", "thermal"],
        default="none",
        help="GPU telemetry fault (GET /sim/gpu): a power or thermal clock-event reason while busy (sim/power.py)",
    )
    s.add_argument(
        "--sim-gpu-power-limit",
        type=float,
        default=None,
        help="W, within the GPU's range: caps the modelled power and slows compute-bound steps (sim/power.py)",
    )
    s.add_argument(
        "--sim-nvml-state",
        default=None,
        help="the NVML stand-in's state file (sim/power.py SimNvml): run under the power limits set there",
    )
    s.add_argument(
        "--sim-extra-spec-algorithms", type=_csv_upper, default=[], help="DDTREE,... (forked builds)"
    )
    s.add_argument(
        "--sim-sglang-version",
        default=DEFAULT_SGLANG_VERSION,
        help=f"SGLang version to emulate ({', '.join(flags.table_versions())})",
    )
    # --help: servesweep's own options first, then SGLang's (hundreds), under a title that says whose; a usage
    # line that names them instead of listing every flag (it was 2,800 lines, and every argparse error prints it)
    p._action_groups.remove(s)
    p._action_groups.insert(0, s)
    p._optionals.title = f"SGLang {version} launch_server flags (the emulator takes each; docs/emulator.md)"
    p.usage = f"%(prog)s --model-path PATH [--sim-* options] [SGLang {version} launch_server flags]"
    return p


def unmodeled_flags(ns: argparse.Namespace, parser: argparse.ArgumentParser, version: str) -> list[str]:
    """The ServerArgs fields set away from SGLang's default that the emulator does not model."""
    field_of = flags.table(version).field_of_dest
    out = set()
    for action in parser._actions:
        if not action.option_strings or action.dest.startswith("sim_") or action.dest == "help":
            continue
        field = field_of.get(action.dest, action.dest)
        if field not in MODELED_FLAGS and getattr(ns, action.dest, None) != parser.get_default(action.dest):
            out.add(field)
    return sorted(out)


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
    return [word for key, val in data.items() for word in flags.plain_words(key, val)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse `argv` with the parser of the SGLang version it asks for (`--sim-sglang-version`, default 0.5.23):
    dests named as ServerArgs fields (as SGLang's from_cli_args), plus `sim_unmodeled_flags` and `launch_command`."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-sglang-version", default=None)
    pre.add_argument("--sim-extra-spec-algorithms", type=_csv_upper, default=[])
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
    parser = build_parser(version, known.sim_extra_spec_algorithms)
    ns = parser.parse_args(full)
    ns.sim_unmodeled_flags = unmodeled_flags(ns, parser, version)
    flags.to_fields(ns, version)
    for field in SERVED_FLAGS - flags.table(version).fields.keys():
        setattr(ns, field, None)  # a flag this version does not have (0.5.9: no default usage chunk): off
    ns.launch_command = list(argv)  # as typed: values read from --config (secrets) stay out of /server_info
    return ns


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from .server import run_server

    return run_server(args)
