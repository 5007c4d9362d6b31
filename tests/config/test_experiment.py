"""Experiment files: errors name file, line, key and problem; the matrix expands as written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from servesweep.config.experiment import ExperimentError, human_int, load_experiment, parse_experiment

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
name: demo
sglang_version: 0.5.11
target:
  inventory: local
model:
  path: Qwen/Qwen3.6-27B
launcher:
  emulator: true
  gpu: RTX A6000
server:
  base:
    context-length: 128k
    mamba_scheduler_strategy: extra_buffer
  axes:
    tp_size: [1, 2]
  env:
    SGLANG_ENABLE_SPEC_V2: 1
  bundles:
    - name: ar
    - name: nextn
      flags: {speculative_algorithm: NEXTN, speculative_num_steps: 3}
load:
  concurrency: [1, 4]
  prompt_tokens: [3k, 100k]
  output_tokens: 256
  requests: 2
exclude:
  - {tp_size: 1, prompt_tokens: 100000}
  - {bundle: nextn, tp_size: 1}
"""


def _errors(text: str) -> list[str]:
    with pytest.raises(ExperimentError) as ei:
        parse_experiment(textwrap.dedent(text), "experiment.yaml")
    return ei.value.problems


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


def test_type_error_names_line_key_and_value():
    errs = _errors(_replace("tp_size: [1, 2]", "tp_size: [1, four]"))
    assert errs == ["experiment.yaml:15: server.axes.tp_size: expected a list of integers, got 'four'"]


def test_scalar_where_an_axis_list_is_needed():
    errs = _errors(_replace("tp_size: [1, 2]", "tp_size: 2"))
    assert errs == ["experiment.yaml:15: server.axes.tp_size: expected a list of integers, got 2"]


def test_unknown_keys_suggest_the_right_one_with_their_lines():
    text = _replace("  requests: 2\n", "  requests: 2\n  concurency: [8]\n").replace("launcher:", "launchr:")
    errs = _errors(text)
    assert "experiment.yaml:7: launchr: unknown key 'launchr' (did you mean 'launcher'?)" in errs
    assert (
        "experiment.yaml:27: load.concurency: unknown key 'concurency' (did you mean 'concurrency'?)" in errs
    )


def test_misspelt_sglang_flag_is_caught_but_fork_flags_pass():
    errs = _errors(_replace("    tp_size: [1, 2]", "    tp_sise: [1, 2]"))
    assert errs == [
        "experiment.yaml:15: server.axes.tp_sise: unknown SGLang flag 'tp_sise' (did you mean 'tp_size'?)"
    ]
    # a forked build's own flag is an error until launcher.extra_flags names it; then it passes through untyped
    forked = _replace("    tp_size: [1, 2]", "    tp_size: [1, 2]\n    ddtree_budget: [16, 32]")
    errs = _errors(forked)
    assert len(errs) == 1 and errs[0].startswith(
        "experiment.yaml:16: server.axes.ddtree_budget: unknown SGLang flag"
    )
    assert "launcher.extra_flags" in errs[0]
    exp = parse_experiment(
        forked.replace("  emulator: true\n", "  emulator: true\n  extra_flags: [ddtree_budget]\n", 1)
    )
    assert {c.flags["ddtree_budget"] for c in exp.server_configs()[0]} == {16, 32}


def test_missing_required_key_and_yaml_syntax_error():
    errs = _errors(_replace("model:\n  path: Qwen/Qwen3.6-27B\n", ""))
    assert errs == ["experiment.yaml:1: model: required key is missing"]
    errs = _errors(_replace("  requests: 2", "  requests: [2"))
    assert len(errs) == 1 and errs[0].startswith("experiment.yaml:") and "YAML syntax error" in errs[0]


def test_exclude_rule_on_an_unknown_axis():
    errs = _errors(_replace("{tp_size: 1, prompt_tokens: 100000}", "{tp_size: 1, prompt_tokn: 100000}"))
    assert errs == [
        "experiment.yaml:28: exclude[0].prompt_tokn: 'prompt_tokn' is not an axis, flag or env var of this "
        "experiment (did you mean 'prompt_tokens'?)"
    ]


def test_bad_values_are_named():
    errs = _errors(_replace("sglang_version: 0.5.11", "sglang_version: latest"))
    assert errs == [
        "experiment.yaml:2: sglang_version: expected a version like 0.5.23 or 0.5.15.post1, got 'latest'"
    ]
    errs = _errors(_replace("  requests: 2", "  requests: 2\nslo: [ttft_p99<=fast]"))
    assert len(errs) == 1 and errs[0].startswith("experiment.yaml:27: slo: SLO 'ttft_p99<=fast'")
    errs = _errors(
        _replace(
            "      flags: {speculative_algorithm: NEXTN",
            "      flags: {tp_size: 4, speculative_algorithm: NEXTN",
        )
    )
    assert errs == [
        "experiment.yaml:21: server.bundles[1].flags.tp_size: 'tp_size' is also a server axis; a bundle may not "
        "override it"
    ]
    errs = _errors(_replace("  inventory: local", "  inventory: hosts.ini\n  port: 0"))
    assert errs == [
        "experiment.yaml:3: target: target.port 0 (a free port picked at run time) works only with inventory 'local'"
    ]
    errs = _errors(
        _replace("model:\n  path: Qwen/Qwen3.6-27B", "model:\n  path: m\n  tokenizer: t\n  port: 3")
    )
    assert errs == ["experiment.yaml:8: model.port: unknown key 'port'"]


def test_expansion_aliases_exclusions_and_ids():
    exp = parse_experiment(GOOD)
    assert human_int("128k") == 128000 and human_int("32Ki") == 32768
    configs, dropped = exp.server_configs()
    # tp × bundles = 4, minus the nextn-at-tp1 rule (a server-only rule drops the whole configuration)
    assert [c.id for c in configs] == ["s01-tp1-ar", "s03-tp2-ar", "s04-tp2-nextn"]
    assert [(c.id, r) for c, r in dropped] == [("s02-tp1-nextn", 1)]
    ar1 = configs[0]
    # dashes and old flag names become dest names; the role renders them for the version
    assert ar1.flags == {"context_length": 128000, "mamba_radix_cache_strategy": "extra_buffer", "tp_size": 1}
    assert ar1.env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert configs[2].flags["speculative_algorithm"] == "NEXTN"
    pts, excl = exp.points_for(ar1)
    assert [p.id for p in pts] == ["s01-tp1-ar.chat-p3000-o256-c1", "s01-tp1-ar.chat-p3000-o256-c4"]
    assert [pid for pid, _ in excl] == ["s01-tp1-ar.chat-p100000-o256-c1", "s01-tp1-ar.chat-p100000-o256-c4"]
    pts2, excl2 = exp.points_for(configs[1])
    assert len(pts2) == 4 and not excl2
    ids = [p.id for c in configs for p in exp.points_for(c)[0]]
    assert len(ids) == len(set(ids))


def test_examples_parse():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        exp = load_experiment(path)
        assert exp.server_configs()[0], path
    q = load_experiment(ROOT / "examples" / "quickstart.yaml")
    configs, _ = q.server_configs()
    assert len(configs) == 2 and sum(len(q.points_for(c)[0]) for c in configs) == 12


WORKLOADS = """\
  endpoint: [chat, completions]
  workload: [single, agent, prefix]
  workloads:
    agent: {session_turns: 3, tool_result_tokens: 200, context_cap_tokens: 200k}
    prefix: {workload: shared_prefix, shared_prefix_tokens: 2k, num_groups: 2}
  output_dist: "lognormal:mean=128,sigma=0.5"
  ignore_eos: false
exclude:
  - {workload: agent, endpoint: completions}
"""


def _with_workloads(text: str = WORKLOADS) -> str:
    head = GOOD[: GOOD.index("  requests: 2\n") + len("  requests: 2\n")]
    return head + text


def test_old_workload_key_still_means_the_endpoint_and_keeps_point_ids():
    old = parse_experiment(_replace("  requests: 2\n", "  requests: 2\n  workload: [chat, completions]\n"))
    assert old.load.endpoint == ["chat", "completions"] and old.load.workload == ["single"]
    ids = [p.id for p in old.points_for(old.server_configs()[0][0])[0]]
    # the ids of files written before `endpoint` existed: resume finds its points
    assert ids == [
        "s01-tp1-ar.chat-p3000-o256-c1",
        "s01-tp1-ar.chat-p3000-o256-c4",
        "s01-tp1-ar.completions-p3000-o256-c1",
        "s01-tp1-ar.completions-p3000-o256-c4",
    ]
    # an exclude rule on `workload: completions` keeps its old meaning too
    ex = parse_experiment(
        _replace("  requests: 2\n", "  requests: 2\n  workload: [chat, completions]\n").replace(
            "  - {bundle: nextn, tp_size: 1}", "  - {bundle: nextn, tp_size: 1}\n  - {workload: completions}"
        )
    )
    assert {p.endpoint for p in ex.points_for(ex.server_configs()[0][0])[0]} == {"chat"}


def test_workloads_axis_names_points_and_carries_loadpoint_fields():
    exp = parse_experiment(_with_workloads())
    ar1 = exp.server_configs()[0][0]
    pts, excl = exp.points_for(ar1)
    # 3 workloads × 2 endpoints × 2 prompts × 2 concurrencies, minus agent on completions (4)
    assert len(pts) == 20 and {p.workload_name for p in pts} == {"single", "agent", "prefix"}
    assert "s01-tp1-ar.agent-chat-p3000-o256-c4" in {p.id for p in pts}
    assert not any(p.workload_name == "agent" and p.endpoint == "completions" for p in pts)
    assert [pid for pid, _ in excl] == [
        f"s01-tp1-ar.agent-completions-p{p}-o256-c{c}" for p in (3000, 100000) for c in (1, 4)
    ]
    # each point is the LoadPoint its load generator gets: its workload's fields, the configuration's labels
    prefix = next(p for p in pts if p.id == "s01-tp1-ar.prefix-chat-p3000-o256-c4")
    assert (prefix.workload, prefix.shared_prefix_tokens, prefix.num_groups) == ("shared_prefix", 2000, 2)
    assert (prefix.concurrency, prefix.requests, prefix.ignore_eos) == (4, 2, False)
    assert prefix.labels["config_id"] == "s01-tp1-ar"
    assert exp.load.workload_fields("prefix") == {
        "ignore_eos": False,
        "output_dist": "lognormal:mean=128,sigma=0.5",
        "workload": "shared_prefix",
        "shared_prefix_tokens": 2000,
        "num_groups": 2,
    }
    assert exp.load.workload_fields("agent")["workload"] == "agent"  # the name is the kind
    assert exp.load.workload_fields("single") == {
        "ignore_eos": False,
        "output_dist": "lognormal:mean=128,sigma=0.5",
    }


def test_workload_errors_name_the_workload_key_and_line():
    errs = _errors(_with_workloads(WORKLOADS.replace("[single, agent, prefix]", "[single, agnet]")))
    assert len(errs) == 1 and errs[0].startswith(
        "experiment.yaml:28: load.workload[1]: workload 'agnet' is not "
    )
    assert "(did you mean 'agent'?)" in errs[0]
    # the agent's context cap must exceed every prompt of the matrix; agent sessions need the chat endpoint
    errs = _errors(_with_workloads(WORKLOADS.replace("context_cap_tokens: 200k", "context_cap_tokens: 50k")))
    assert errs == [
        "experiment.yaml:30: load.workloads.agent: workload 'agent' with endpoint chat, prompt_tokens 100000: "
        "context_cap_tokens=50000 must be above prompt_tokens=100000"
    ]
    errs = _errors(_with_workloads(WORKLOADS.replace("num_groups: 2", "num_grups: 2")))
    assert errs == [
        "experiment.yaml:31: load.workloads.prefix.num_grups: unknown key 'num_grups' (did you mean 'num_groups'?)"
    ]


def test_dry_run_of_the_rtx_pro_6000_example_keeps_configs_and_the_ends_of_each_axis():
    from servesweep.matrix.planner import make_plan
    from servesweep.matrix.run_setup import shrink_for_dry_run

    exp = load_experiment(ROOT / "examples" / "qwen36-27b-rtxpro6000.yaml")
    dry = shrink_for_dry_run(exp)
    full, small = make_plan(exp), make_plan(dry)
    assert [c.config.id for c in small.configs] == [c.config.id for c in full.configs]  # every configuration
    assert dry.load.concurrency == [1, 100] and dry.load.prompt_tokens == [3000, 100000]
    assert dry.load.output_tokens == [8] and dry.load.requests == 1
    assert dry.load.workload == ["single", "agent"] and dry.load.workloads["agent"].session_turns == 2
    n_full = sum(len(c.points) for c in full.configs)
    n_small = sum(len(c.points) for c in small.configs)
    # 15 configurations × (single: 2 prompts × 2 concurrencies, the 100k×100 point excluded = 3; agent: 3k only, 2)
    # = 75 points at most (instead of hundreds), each one short request per user
    assert n_small <= 75 < n_full, (n_small, n_full)
    print(f"dry-run points: {n_small} of {n_full}")


def test_every_validation_of_an_experiment_makes_the_checks_across_fields():
    """One path to a validated experiment: the checks across fields are the model's own, so an experiment
    validated from a dict (a dry run's shrunk experiment, the one a resumed run's manifest stored) gets them as a
    file does, each at the key it names; in a file, at that key's line."""
    from pydantic import ValidationError

    from servesweep.config.experiment import Experiment

    good = parse_experiment(GOOD).model_dump(mode="json")
    assert Experiment.model_validate(good).name == "demo"
    bad = {**good, "sglang_version": None}
    bad["server"] = {**good["server"], "bundles": [*good["server"]["bundles"], good["server"]["bundles"][0]]}
    with pytest.raises(ValidationError) as ei:
        Experiment.model_validate(bad)
    assert {(e["loc"], e["msg"]) for e in ei.value.errors()} == {
        (("sglang_version",), "required key is missing (the SGLang version the flags are rendered for)"),
        (("server", "bundles", 0, "name"), "bundle name 'ar' is used twice"),
        (("server", "bundles", 2, "name"), "bundle name 'ar' is used twice"),
    }
    # the server flags too: an alias and a dashed name, from a dict, come out as SGLang's current names, typed
    raw = {
        **good,
        "server": {
            **good["server"],
            "base": {"context-length": "128k", "mamba_scheduler_strategy": "no_buffer"},
        },
    }
    assert Experiment.model_validate(raw).server.base == {
        "context_length": 128_000,
        "mamba_radix_cache_strategy": "no_buffer",
    }
    with pytest.raises(ValidationError) as ei:
        Experiment.model_validate({**raw, "server": {**raw["server"], "base": {"context_lenght": 4096}}})
    assert [(e["loc"], e["msg"]) for e in ei.value.errors()] == [
        (
            ("server", "base", "context_lenght"),
            "unknown SGLang flag 'context_lenght' (did you mean 'context_length'?)",
        )
    ]
    assert _errors(_replace("sglang_version: 0.5.11\n", "")) == [
        "experiment.yaml:1: sglang_version: required key is missing (the SGLang version the flags are rendered for)"
    ]
