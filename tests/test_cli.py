"""The `servesweep` command as a user runs it (real subcommands, real files): every subcommand answers -h, and a
domain error (servesweep.exit_codes, raised by code that does not import click) comes out as click's `Error: ...`
with the usage line where the input was wrong, and the exit code it always had (issue 29: the CLI in cli/)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from servesweep.cli import SUBCOMMANDS, main


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, r.output


def test_every_subcommand_answers_help():
    code, out = _run("--help")
    assert code == 0
    for name in SUBCOMMANDS:
        assert name in out
        code, out_sub = _run(name, "--help")
        assert code == 0 and out_sub.lower().startswith("usage: "), out_sub  # (sim's is argparse's)


def test_a_bad_option_is_2_under_the_usage_line():
    code, out = _run("load", "--concurrency", "0")
    assert code == 2, out
    assert out.splitlines()[:2] == ["Usage: main load [OPTIONS]", "Try 'main load --help' for help."], out
    assert out.rstrip().endswith(
        "Error: Invalid value for --concurrency: '0' in '0' is not a positive integer"
    ), out


def test_options_that_do_not_go_together_are_2():
    code, out = _run("compare", "runs/a")
    assert code == 2 and out.startswith("Usage: main compare [OPTIONS] RUNS..."), out
    assert "Error: give at least two run folders: BASELINE RUN [RUN ...]" in out
    code, out = _run("prompts", "--export", "sglang", "--prompt-tokens", "60", "-n", "2")
    assert code == 2 and "Error: --export FORMAT and --out FILE go together" in out, out


def test_a_command_that_cannot_do_its_work_says_error_and_keeps_its_code(tmp_path):
    code, out = _run("trace", "stats", str(tmp_path / "missing.jsonl"))
    assert code == 1 and out.startswith("Error: ") and "missing.jsonl" in out, out
    assert "Usage:" not in out  # not a usage error: the input named a file that is not there
    code, out = _run("trace", "synth", str(tmp_path / "t.jsonl"), "--requests", "8")
    assert code == 0, out
    code, out = _run("trace", "sample", str(tmp_path / "t.jsonl"), str(tmp_path / "w.jsonl"), "--sample", "3")
    assert code == 1 and out.startswith("Error: "), out
    code, out = _run("trace", "stats", str(tmp_path / "t.jsonl"), "--json")
    assert code == 0 and json.loads(out)["requests"] == 8


def test_could_not_run_of_a_command_outside_cli_is_2_too(tmp_path):
    """`run` raises CouldNotRun from matrix/orchestrator.py; the `servesweep` group turns it into exit 2."""
    code, out = _run("run", "--resume", str(tmp_path))  # a folder, but no run's manifest.json in it
    assert code == 2 and out.startswith("Error: ") and "manifest.json" in out, out
    assert "Traceback" not in out
