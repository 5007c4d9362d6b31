"""`servesweep sim` flags: SGLang's parser of the emulated version (its flag table): names, aliases, prefix matching,
version-specific names, failures like SGLang."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servesweep.sglang.flags import human_readable_int
from servesweep.sim.cli import parse_args
from servesweep.sim.faults import Fault, FaultPicker, parse_fault, parse_fault_rates


def run_sim(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servesweep.sim", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.fast
def test_aliases_prefixes_and_human_ints():
    ns = parse_args(
        ["--model", "Qwen/Qwen3.6-27B", "--tp", "4", "--dp", "2", "--speculative-algo", "nextn",
         "--context-length", "128k", "--max-total-tokens", "32Ki", "--chunked-prefill-size", "4096"]
    )  # fmt: skip
    assert ns.model_path == "Qwen/Qwen3.6-27B"
    assert (ns.tp_size, ns.dp_size) == (4, 2)
    # SGLang's parser keeps the string as typed; the start-up resolution upper-cases it
    assert ns.speculative_algorithm == "nextn"
    assert ns.context_length == 128_000
    assert ns.max_total_tokens == 32 * 1024
    assert ns.chunked_prefill_size == 4096
    assert ns.host == "127.0.0.1" and ns.port == 30000 and ns.max_prefill_tokens == 16384
    assert ns.stream_interval == 1 and ns.kv_cache_dtype == "auto" and ns.schedule_policy == "fcfs"
    assert ns.mamba_radix_cache_strategy == "auto"
    # SGLang's human_readable_int: SI suffixes are decimal and case-sensitive (1M = 1,000,000; 1m and 32K fail)
    assert human_readable_int("1M") == 10**6 and human_readable_int("1Mi") == 2**20
    for bad in ("1m", "32K"):
        with pytest.raises(Exception, match="Invalid integer"):
            human_readable_int(bad)
    with pytest.raises(Exception, match="Decimals"):
        human_readable_int("1.5Ki")


def test_integers_sglang_reads_plainly_reject_suffixes():
    """--max-running-requests and --chunked-prefill-size are plain int in SGLang: 4K fails there, so here."""
    for flag in ("--chunked-prefill-size", "--max-running-requests"):
        r = run_sim("--model-path", "m", flag, "4k")
        assert r.returncode == 2 and f"argument {flag}: invalid int value: '4k'" in r.stderr


@pytest.mark.fast
def test_0_5_11_keeps_tp_size_under_its_field_name():
    """0.5.11's parser stores --tp-size as tensor_parallel_size; ServerArgs.from_cli_args copies it to tp_size."""
    ns = parse_args(["--model-path", "m", "--sim-sglang-version", "0.5.11", "--tp-size", "2", "--dp", "2"])
    assert (ns.tp_size, ns.dp_size) == (2, 2) and not hasattr(ns, "tensor_parallel_size")


@pytest.mark.fast
def test_flags_not_modeled_are_accepted_and_listed():
    ns = parse_args(
        ["--model-path", "m", "--disable-custom-all-reduce", "--enable-dp-attention", "--tp", "2"]
    )
    assert ns.sim_unmodeled_flags == ["disable_custom_all_reduce", "enable_dp_attention"]
    assert parse_args(["--model-path", "m", "--tp", "2"]).sim_unmodeled_flags == []


@pytest.mark.fast
def test_version_specific_flag_names():
    # 0.5.12: old names only
    ns = parse_args(
        ["--model-path", "m", "--sim-sglang-version", "0.5.12", "--mamba-scheduler-strategy", "no_buffer",
         "--cuda-graph-max-bs", "64"]
    )  # fmt: skip
    assert ns.mamba_scheduler_strategy == "no_buffer" and ns.cuda_graph_max_bs == 64
    # 0.5.15.post1: new names, old ones are deprecated aliases onto the new dests
    ns = parse_args(
        ["--model-path", "m", "--sim-sglang-version", "0.5.15.post1", "--mamba-scheduler-strategy", "extra_buffer",
         "--cuda-graph-max-bs", "32"]
    )  # fmt: skip
    assert ns.mamba_radix_cache_strategy == "extra_buffer" and ns.cuda_graph_max_bs_decode == 32


def test_old_names_fail_on_0_5_23_like_sglang():
    r = run_sim("--model-path", "m", "--cuda-graph-max-bs", "8")
    assert r.returncode == 2
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode" in r.stderr
    r = run_sim("--model-path", "m", "--mamba-scheduler-strategy", "auto")
    assert r.returncode == 2 and "unrecognized arguments: --mamba-scheduler-strategy auto" in r.stderr


def test_unknown_flag_fails_with_argparse_exit_2():
    r = run_sim("--model-path", "m", "--no-such-flag", "1")
    assert r.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag 1" in r.stderr
    # the click wrapper passes everything through to the same parser
    r = subprocess.run(
        [sys.executable, "-m", "servesweep.cli", "sim", "--model-path", "m", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


def test_unknown_speculative_algorithm_fails_like_sglang():
    r = run_sim("--model-path", "Qwen/Qwen3.6-27B", "--speculative-algorithm", "FOO")
    assert r.returncode != 0
    assert "ValueError: Unknown speculative algorithm name: FOO" in r.stderr
    # up to 0.5.10 the flag was a closed choice list: argparse rejects it
    r = run_sim(
        "--model-path",
        "Qwen/Qwen3.6-27B",
        "--sim-sglang-version",
        "0.5.9",
        "--speculative-algorithm",
        "DFLASH",
    )
    assert r.returncode == 2 and "invalid choice: 'DFLASH'" in r.stderr


def test_bad_sim_flags_name_the_problem():
    r = run_sim("--model-path", "m", "--sim-fault-rate", "teapot=0.1")
    assert r.returncode == 2 and "unknown fault kind 'teapot'" in r.stderr
    r = run_sim("--model-path", "m", "--sim-calibration", "decode_eff")
    assert r.returncode == 2 and "'decode_eff' is not KEY=VALUE" in r.stderr
    r = run_sim("--model-path", "m", "--sim-sglang-version", "five")
    assert r.returncode == 2 and "--sim-sglang-version 'five'" in r.stderr
    r = run_sim("--model-path", "m", "--sim-sglang-version", "0.5.99")
    assert r.returncode == 2 and "no flag table for this SGLang version" in r.stderr


@pytest.mark.fast
def test_fault_parsing_and_seeded_rates():
    assert parse_fault("stall:2.5") == Fault("stall", 2.5)
    assert parse_fault("429") == Fault("429")
    assert parse_fault("disconnect").arg == 2
    with pytest.raises(ValueError, match="takes no argument"):
        parse_fault("503:1")
    with pytest.raises(ValueError, match="sum to"):
        parse_fault_rates("429=0.7,500=0.6")
    rates = parse_fault_rates("429=0.25,stall:1=0.25")
    a = [FaultPicker(rates, seed=7).pick(None) for _ in range(1)]
    picks1 = FaultPicker(rates, seed=7)
    picks2 = FaultPicker(rates, seed=7)
    s1 = [picks1.pick(None) for _ in range(400)]
    s2 = [picks2.pick(None) for _ in range(400)]
    assert s1 == s2 and a[0] == s1[0]
    frac = sum(f is not None for f in s1) / len(s1)
    assert 0.38 < frac < 0.62  # 0.5 expected


@pytest.mark.fast
def test_help_shows_servesweeps_options_first_and_a_short_usage():
    """Issue 34, item 9: `servesweep sim --help` listed SGLang's flags in a 2,800-line usage, servesweep's last."""
    from servesweep.sim.cli import build_parser

    for version in ("0.5.9", "0.5.23"):
        lines = build_parser(version).format_help().splitlines()
        assert lines[0] == f"usage: servesweep sim --model-path PATH [--sim-* options] [SGLang {version} launch_server flags]"
        ours = lines.index("emulator (servesweep):")
        sglang = next(i for i, line in enumerate(lines) if line.startswith(f"SGLang {version} launch_server flags"))
        assert ours < sglang
        assert ours < next(i for i, line in enumerate(lines) if line.lstrip().startswith("--sim-gpu")) < sglang
        assert next(i for i, line in enumerate(lines) if "--tp-size" in line) > sglang
