"""One description of a point: every knob of LoadPoint's table (config.point.knobs) appears on each front door
(`servesweep load`, the Locust start form, the experiment's load:) under its one name and with its one default, or
says where that front door sets it instead; and no front door has an option that is neither a knob nor one of its
documented sweep or run settings."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from servesweep.cli.load import command
from servesweep.config.experiment import POINT_SCALARS, Load, WorkloadSpec
from servesweep.config.point import GROUPS, SURFACES, LoadPoint, knobs
from servesweep.driver.load import SWEEP_AXES

# load: keys that are not one point's knobs: the run's settings, and the names of its workloads.
YAML_RUN_KEYS = {"workers", "worker_hosts", "max_failure_rate", "workloads", "workload"}
# load: axes are lists of a knob's values, under the knob's name (`rate` for rate_rps: the key is the CLI's).
YAML_AXES = {
    "concurrency": "concurrency",
    "rate_rps": "rate",
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "endpoint": "endpoint",
}
# `servesweep load` options that are not one point's knobs (run settings; the axes are checked below).
CLI_RUN_OPTIONS = {
    "--base-url", "--api-key-file", "--workers", "--worker-inventory", "--worker-group", "--workers-per-host",
    "--master-host", "--master-port", "--slo", "--max-failure-rate", "--metrics-port", "--sim-args", "--out",
    "--json", "--resume", "--help",
}  # fmt: skip


def _cli_options() -> dict[str, click.Option]:
    return {o.opts[0]: o for o in command.params if isinstance(o, click.Option)}


def _form_actions() -> list:
    """The Locust parser's actions shown in the start form, with servesweep's web UI loaded (as locustfiles/llm.py
    does), in their order; plus every action servesweep added."""
    code = (
        "import json, servesweep.client.webui\n"
        "from locust.argument_parser import get_parser\n"
        "p = get_parser(); base = {a.dest for a in __import__('locust.argument_parser').argument_parser"
        ".get_empty_argument_parser()._actions}\n"
        "print(json.dumps([[a.dest, a.option_strings[0] if a.option_strings else '', repr(a.default), "
        "getattr(a, 'include_in_web_ui', False), a.help or ''] for a in p._actions]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.fast
def test_every_knob_has_a_group_help_and_cli_name():
    ks = knobs()
    assert ks and all(k.group in GROUPS and k.help and k.cli.startswith("--") for k in ks)
    assert len({k.cli for k in ks}) == len(ks), "one CLI name per knob"
    for k in ks:
        assert set(dict(k.elsewhere)) <= set(SURFACES), k.name
        if k.kind == "flag":
            assert k.default is True and k.cli.startswith("--no-"), f"{k.name}: a flag switches off a default"


@pytest.mark.fast
def test_cli_options_are_the_table():
    opts = _cli_options()
    for k in knobs("cli"):
        if k.cli in SWEEP_AXES:
            assert SWEEP_AXES[k.cli] == k.name and k.cli in opts
            continue
        o = opts.get(k.cli)
        assert o is not None, f"{k.name}: no {k.cli} in servesweep load"
        default = o.default if not callable(o.default) else o.default()
        assert k.value(default) == (None if k.default is ... else k.default), k.cli
    extra = set(opts) - {k.cli for k in knobs("cli")} - CLI_RUN_OPTIONS
    assert not extra, f"servesweep load options in no table: {sorted(extra)}"


def test_form_parameters_are_the_table_grouped_ramp_first():
    import ast

    actions = _form_actions()
    shown = [a for a in actions if a[3]]
    by_cli = {a[1]: a for a in actions}
    for k in knobs("form"):
        a = by_cli.get(k.cli)
        assert a is not None and a[3], f"{k.name}: {k.cli} is not in the start form"
        assert k.cli in a[4] and f"[{k.group}]" in a[4], f"{k.cli}: help names the flag and the group"
        assert k.value(ast.literal_eval(a[2])) == (None if k.default is ... else k.default), k.cli
    servesweep = [a for a in shown if a[4].startswith("[")]
    groups = [a[4][1 : a[4].index("]")] for a in servesweep]
    assert groups == sorted(groups, key=GROUPS.index), "the form lists the knobs group by group"
    assert [a[1] for a in servesweep[:4]] == [
        "--load-shape",
        "--ramp-steps",
        "--ramp-hold",
        "--ramp-spawn-rate",
    ]
    knob_clis = {k.cli for k in knobs("form")}
    ramp = {"--load-shape", "--ramp-steps", "--ramp-hold", "--ramp-spawn-rate"}
    ours = {a[1] for a in servesweep} | {a[1] for a in shown if a[0] == "slo"}
    assert ours - knob_clis - ramp == {"--slo"}, "the form's only run setting is --slo"


@pytest.mark.fast
def test_yaml_load_keys_are_the_table():
    fields = Load.model_fields
    for k in knobs("yaml"):
        if k.name in YAML_AXES:
            f = fields[YAML_AXES[k.name]]
            if k.default is ...:
                assert f.is_required(), k.name
            elif k.default is None:
                assert f.default is None, k.name
            else:
                assert f.default_factory() == [k.default], f"load.{YAML_AXES[k.name]}: [{k.default!r}]"
        elif k.group == "workload":
            f = WorkloadSpec.model_fields[k.name]
            assert f.default == k.default, f"load.workloads.<name>.{k.name}"
        else:
            assert k.name in fields, f"load.{k.name} is missing"
            assert fields[k.name].default == k.default, f"load.{k.name}"
    for k in knobs():
        if not k.on("yaml"):
            assert k.name not in fields or k.name == "workload", (
                f"{k.name} is set in {dict(k.elsewhere)['yaml']}"
            )
    names = {YAML_AXES.get(k.name, k.name) for k in knobs("yaml")}
    extra = set(fields) - names - YAML_RUN_KEYS
    assert not extra, f"load: keys that are not knobs: {sorted(extra)}"
    assert set(WorkloadSpec.model_fields) - {"workload"} <= {k.name for k in knobs()}
    assert set(POINT_SCALARS) <= set(fields) and set(POINT_SCALARS) <= set(LoadPoint.model_fields)


@pytest.mark.fast
def test_the_yaml_sets_every_timeout():
    ld = Load(concurrency=[1], requests=1, connect_s="5s", first_token_s="2m", stall_s=30, total_s="1h")
    f = ld.point_fields("single")
    assert (f["connect_s"], f["first_token_s"], f["stall_s"], f["total_s"]) == (5, 120, 30, 3600)
