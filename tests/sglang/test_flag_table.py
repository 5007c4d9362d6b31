"""The one SGLang flag table (src/servesweep/sglang/flags/sglang-<v>.json, read from SGLang's own parser): every
launch flag of 0.5.11 and 0.5.23 parses in the emulator and passes experiment validation, renders back to argv
that sets the same value, prefixes resolve as SGLang's parser resolves them, and an experiment with flags the
emulator does not model completes its dry run."""

from __future__ import annotations

import json
import subprocess
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import SERVESWEEP, emulator_experiment_head

from servesweep.config.experiment import ExperimentError, parse_experiment
from servesweep.sglang import flags
from servesweep.sim.cli import build_parser
from servesweep.sim.launch import start_sim

VERSIONS = ("0.5.11", "0.5.23")
MODEL = "Qwen/Qwen3.6-27B"


def _typed(row: dict[str, Any], word: str) -> Any:
    """An argv word as an experiment file writes the value."""
    kind = row["type"]
    if kind == "int":
        return int(word)
    if kind == "float":
        return float(word)
    return word  # human ints stay "8k", JSON stays a JSON string, string choices as SGLang spells them


def experiment_value(flag: flags.Flag) -> Any:
    """A valid experiment value for a flag, from the table's own sample argv words."""
    words = flags.sample_words(flag.row)
    if flag.kind in ("switch", "bool"):
        return True
    if flag.kind == "list":
        return [_typed(flag.row, w) for w in words]
    return _typed(flag.row, words[0])


def _namespace_value(ns: Any, dest: str) -> Any:
    return json.loads(json.dumps(getattr(ns, dest), default=str))


@pytest.mark.fast
@pytest.mark.parametrize("version", VERSIONS)
def test_every_option_string_with_a_valid_value_parses_in_the_emulator_as_in_sglangs_parser(version):
    raw = flags.load_table(version)
    sglang = flags.parser(version, raise_errors=True)
    sim = build_parser(version)
    base = ["--model-path", MODEL]
    n = 0
    for row in raw["options"]:
        for opt in row["option_strings"]:
            argv = base + [opt, *flags.sample_words(row)]
            want = sglang.parse_args(argv)
            got = sim.parse_args(argv)
            assert _namespace_value(got, row["dest"]) == _namespace_value(want, row["dest"]), argv
            n += 1
    assert n == raw["counts"]["option_strings"] and n > {"0.5.11": 380, "0.5.23": 550}[version]


@pytest.mark.fast
@pytest.mark.parametrize("version", VERSIONS)
def test_every_flag_passes_experiment_validation_and_renders_back_to_the_same_value(version):
    t = flags.table(version)
    values = {f: experiment_value(flag) for f, flag in t.fields.items() if f not in flags.RESERVED_FLAGS}
    plain = {"sglang_version": version, "server": {"base": dict(values)}}
    problems: list = []
    out = flags.normalise_flags(plain, problems)
    assert problems == []
    base = out["server"]["base"]
    assert len(base) == len(values) > {"0.5.11": 360, "0.5.23": 520}[version]
    # every flag at once through the role's argv and the emulator's parser: each field gets the value SGLang's
    # parser gives it for the same flag and value alone
    argv = flags.render_argv(base, version)
    ns = flags.to_fields(build_parser(version).parse_args(["--model-path", MODEL, *argv]), version)
    sglang = flags.parser(version, raise_errors=True)
    for field in values:
        flag = t.fields[field]
        alone = sglang.parse_args(["--model-path", MODEL, flag.option, *flags.sample_words(flag.row)])
        want = _namespace_value(flags.to_fields(alone, version), field)
        assert _namespace_value(ns, field) == want, (field, argv)


@pytest.mark.fast
@pytest.mark.parametrize("version", VERSIONS)
def test_reserved_flags_are_refused(version):
    problems: list = []
    flags.normalise_flags(
        {"sglang_version": version, "server": {"base": {"model": "x", "port": 1, "api-key": "k"}}}, problems
    )
    assert sorted(p[1] for p in problems) == [
        "set by servesweep from model.path; do not give it as a flag",
        "set by servesweep from secrets; do not give it as a flag",
        "set by servesweep from target.port; do not give it as a flag",
    ]


def _resolve(parser, option: str) -> tuple[str, Any]:
    """How argparse reads `option`: ("unique", dest), ("ambiguous", None) or ("unknown", None)."""
    try:
        got = parser._parse_optional(option)
    except flags.FlagError:
        return ("ambiguous", None)
    action = None if got is None else got[0] if isinstance(got, tuple) else got[0][0]
    return ("unknown", None) if action is None else ("unique", action.dest)


@pytest.mark.fast
@pytest.mark.parametrize("version", VERSIONS)
def test_prefixes_and_ambiguities_match_sglangs_parser(version):
    t = flags.table(version)
    sglang = flags.parser(version, raise_errors=True)
    longs = sorted(o for o in t.by_option if o.startswith("--"))
    prefixes = {o[:i] for o in longs for i in range(3, len(o))} - set(longs)
    counts = {"unique": 0, "ambiguous": 0, "unknown": 0}
    for prefix in sorted(prefixes):
        want = _resolve(sglang, prefix)
        counts[want[0]] += 1
        try:
            flag = t.resolve_prefix(prefix[2:])
            got = ("unknown", None) if flag is None else ("unique", flag.row["dest"])
        except flags.FlagError:
            got = ("ambiguous", None)
        assert got[0] == want[0], prefix
        if got[0] == "unique":
            assert t.fields[t.field_of_dest.get(want[1], want[1])] is flag, prefix
    assert counts["unique"] > 4000 and counts["ambiguous"] > 700


@pytest.mark.fast
def test_known_prefix_and_rename_cases():
    # the emulator fails as SGLang fails: --cuda-graph-max-bs is ambiguous on 0.5.23, exact on 0.5.11
    assert flags.table("0.5.11").lookup("cuda_graph_max_bs").field == "cuda_graph_max_bs"
    with pytest.raises(
        flags.FlagError, match="could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    ):
        flags.table("0.5.23").resolve_prefix("cuda_graph_max_bs")
    # an experiment names flags once for every version: renames come from the tables
    assert flags.flag_in("cuda_graph_max_bs", "0.5.23").field == "cuda_graph_max_bs_decode"
    assert flags.flag_in("mamba_radix_cache_strategy", "0.5.11").option == "--mamba-scheduler-strategy"
    assert flags.canonical_name("mamba_scheduler_strategy") == "mamba_radix_cache_strategy"
    assert flags.flag_in("tp", "0.5.11").field == "tp_size"  # a unique prefix
    assert flags.flag_in("tensor_parallel_size", "0.5.23").field == "tp_size"  # an alias


@pytest.mark.fast
def test_render_argv_uses_each_versions_option_strings():
    f = {
        "tp_size": 2,
        "fp8_gemm_runner_backend": "auto",
        "lora_strict_loading": False,
        "enable_metrics": True,
        "disable_radix_cache": False,
        "context_length": 131072,
        "cuda_graph_max_bs_decode": 32,
        "ddtree_budget": 16,  # a forked build's own flag: passed through
    }
    assert flags.render_argv(f, "0.5.23") == [
        "--context-length", "131072", "--cuda-graph-max-bs-decode", "32", "--ddtree-budget", "16",
        "--enable-metrics", "--fp8-gemm-backend", "auto", "--no-lora-strict-loading", "--tp-size", "2",
    ]  # fmt: skip
    old = flags.render_argv(f, "0.5.11")
    assert "--cuda-graph-max-bs" in old and "--tp-size" in old and "--fp8-gemm-backend" in old
    # a generic server: its flags as they are named
    assert flags.render_argv({"cuda_graph_max_bs_decode": 32, "x": {"a": 1}, "y": [1, 2]}, None) == [
        "--cuda-graph-max-bs-decode", "32", "--x", '{"a": 1}', "--y", "1", "2",
    ]  # fmt: skip


EXPERIMENT = """\
name: flags
sglang_version: {version}
target: {{inventory: local}}
model: {{path: Qwen/Qwen3.6-27B}}
server:
  base:
{base}
load:
  concurrency: [1]
  prompt_tokens: [100]
  output_tokens: 4
  requests: 1
"""


def _problems(version: str, base: str) -> list[str]:
    text = EXPERIMENT.format(version=version, base=textwrap.indent(base, "    "))
    try:
        parse_experiment(text, "e.yaml")
    except ExperimentError as e:
        return e.problems
    return []


@pytest.mark.fast
def test_validation_follows_each_versions_types_and_choices():
    assert _problems("0.5.23", "context_length: 32K") == [
        "e.yaml:7: server.base.context_length: expected an integer, got '32K'"
    ]
    assert _problems("0.5.23", "chunked_prefill_size: 8k") == [
        "e.yaml:7: server.base.chunked_prefill_size: expected an integer, got '8k'"
    ]
    assert _problems("0.5.11", "speculative_algorithm: DDTREE") == [
        "e.yaml:7: server.base.speculative_algorithm: argument --speculative-algorithm: invalid choice: 'DDTREE' "
        "(choose from 'DFLASH', 'EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM') (SGLang 0.5.11: "
        "--speculative-algorithm)"
    ]
    assert _problems("0.5.23", "speculative_algorithm: DDTREE") == []  # a free string from 0.5.12 on
    assert _problems("0.5.23", "cuda_graph_max_b: 8") == [
        "e.yaml:7: server.base.cuda_graph_max_b: ambiguous option: --cuda-graph-max-b could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill (SGLang 0.5.23)"
    ]
    assert _problems(
        "0.5.9", "mamba_radix_cache_strategy: extra_buffer\nspeculative_dflash_block_size: 8"
    ) == [
        "e.yaml:8: server.base.speculative_dflash_block_size: SGLang 0.5.9 has no flag 'speculative_dflash_block_size'"
        " (added in 0.5.11: SGLang 0.5.11 to 0.5.23 have it; raise sglang_version, or name it in "
        "launcher.extra_flags for a build of your own that has it)"
    ]
    assert _problems("0.5.23", "disable_custm_all_reduce: true") == [
        "e.yaml:7: server.base.disable_custm_all_reduce: unknown SGLang flag 'disable_custm_all_reduce' "
        "(did you mean 'disable_custom_all_reduce'?)"
    ]
    assert _problems("0.5.30", "tp_size: 1")[0].startswith(
        "e.yaml:2: sglang_version: no flag table for SGLang 0.5.30"
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_a_handful_of_flags_start_the_emulator_for_real(version, tmp_path):
    args = ["--model-path", MODEL, "--sim-sglang-version", version, "--sim-load-time", "0"]
    args += ["--tp", "2", "--disable-custom-all-reduce", "--enable-dp-attention", "--context-length", "32k"]
    args += ["--watchdog-timeout", "600", "--enable-metrics", "--chunked-prefill-size", "4096"]
    log = tmp_path / "sim.log"
    with start_sim(args, log_path=log) as sim:
        with urllib.request.urlopen(sim.base_url + "/server_info", timeout=10) as r:
            info = json.loads(r.read())
    assert info["tp_size"] == 2 and info["chunked_prefill_size"] == 4096 and info["watchdog_timeout"] == 600
    assert info["disable_custom_all_reduce"] is True and info["enable_dp_attention"] is True
    assert info["sim_unmodeled_flags"] == [
        "disable_custom_all_reduce",
        "enable_dp_attention",
        "watchdog_timeout",
    ]
    assert (
        "accepted, not modeled: disable_custom_all_reduce, enable_dp_attention, watchdog_timeout"
        in log.read_text()
    )


def test_an_experiment_with_flags_the_emulator_does_not_model_completes_its_dry_run(tmp_path):
    f = tmp_path / "exp.yaml"
    head = emulator_experiment_head(tmp_path, "unmodeled")
    f.write_text(
        head.replace(
            "base: {context_length: 4096, max_running_requests: 8}",
            "base: {context_length: 4096, max_running_requests: 8, disable_custom_all_reduce: true,"
            " enable_dp_attention: true}",
        )
        + textwrap.dedent(
            """\
            load:
              concurrency: [1, 2]
              prompt_tokens: [160]
              output_tokens: 4
              requests: 2
            """
        )
    )
    exp = parse_experiment(f.read_text())
    assert exp.server_configs()[0][0].flags["disable_custom_all_reduce"] is True
    r = subprocess.run(
        SERVESWEEP + ["run", str(f), "--dry-run", "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    run_dir = next((tmp_path / "runs").iterdir())
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["dry_run"] is True and {p["status"] for p in m["points"].values()} == {"done"}
    saved = json.loads(next((run_dir / "servers").glob("*/server_info.json")).read_text())
    argv = saved["argv"]
    assert "--disable-custom-all-reduce" in argv and "--enable-dp-attention" in argv
    assert saved["server_info"]["sim_unmodeled_flags"] == ["disable_custom_all_reduce", "enable_dp_attention"]


@pytest.mark.fast
def test_tables_ship_for_every_emulated_version():
    assert flags.table_versions() == (
        "0.5.9",
        "0.5.10",
        "0.5.11",
        "0.5.12",
        "0.5.15.post1",
        "0.5.20",
        "0.5.23",
    )
    for v in flags.table_versions():
        raw = flags.load_table(v)
        assert raw["sglang_version"] == v and raw["parser"]["allow_abbrev"] is True
        assert Path(flags.__file__).with_name("flags").joinpath(f"sglang-{v}.json").is_file()
