"""Issue 34, item 3: a flag the configured SGLang version does not have is caught at `plan`, not minutes later when
the server rejects it. Another server's name (vLLM, TensorRT-LLM, TGI) says whose it is and SGLang's own; a typo
gets did-you-mean; a flag of other SGLang versions says when it came or went; a patched or forked build's own flag
passes only when `launcher.extra_flags` names it."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from servesweep.cli import main
from servesweep.config.experiment import ExperimentError, parse_experiment
from servesweep.sglang.flags import (
    FOREIGN_FLAGS,
    flag_in,
    foreign_flag_owner,
    sglang_equivalent,
    table_versions,
)

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


def _yaml(base: str, version: str = "0.5.23", launcher: str = "emulator: true") -> str:
    return textwrap.dedent(
        f"""\
        name: flags
        sglang_version: {version}
        target: {{inventory: local}}
        model: {{path: Qwen/Qwen3.6-27B}}
        launcher: {{{launcher}}}
        server:
          base: {{{base}}}
        load: {{concurrency: [1], prompt_tokens: [100], output_tokens: 8, requests: 2}}
        """
    )


def _errors(base: str, **kw) -> list[str]:
    try:
        parse_experiment(_yaml(base, **kw))
    except ExperimentError as e:
        return e.problems
    return []


def test_vllm_flag_names_its_owner_and_sglangs_flag():
    """The issue's case: vLLM's gpu_memory_utilization, with dashes or underscores."""
    for key in ("gpu_memory_utilization", "gpu-memory-utilization"):
        assert _errors(f"{key}: 0.85") == [
            f"experiment.yaml:7: server.base.{key}: not an SGLang flag: gpu_memory_utilization is vLLM's; "
            "SGLang's is mem_fraction_static"
        ]
    assert _errors("max_num_seqs: 8") == [
        "experiment.yaml:7: server.base.max_num_seqs: not an SGLang flag: max_num_seqs is vLLM's; SGLang's is "
        "max_running_requests"
    ]
    # a switch SGLang has on by default: the advice is to leave it out
    (e,) = _errors("enable_prefix_caching: true")
    assert "is vLLM's; SGLang caches prefixes by default" in e and "disable_radix_cache" in e
    # TensorRT-LLM's and TGI's too
    (e,) = _errors("kv_cache_free_gpu_memory_fraction: 0.9")
    assert "is TensorRT-LLM's; SGLang's is mem_fraction_static" in e
    (e,) = _errors("num_shard: 2")
    assert "num_shard is TGI's; SGLang's is tp_size" in e


def test_the_equivalent_is_named_as_the_configured_version_names_it():
    """cuda_graph_bs was split into cuda_graph_bs_decode/_prefill by 0.5.23: the advice follows the version."""
    assert foreign_flag_owner("cuda_graph_sizes", "0.5.23") == "vLLM's; SGLang's is cuda_graph_bs_decode"
    assert foreign_flag_owner("cuda_graph_sizes", "0.5.9") == "vLLM's; SGLang's is cuda_graph_bs"
    (e,) = _errors("enforce_eager: true")
    assert "enforce_eager is vLLM's; in SGLang: cuda_graph_backend_decode: disabled" in e
    (e,) = _errors("enforce_eager: true", version="0.5.9")
    assert "in SGLang: disable_cuda_graph: true" in e


def test_every_foreign_equivalent_exists_in_some_sglang_version():
    """The table's advice is never a name SGLang lacks: each equivalent resolves in the newest version, or (for a
    flag replaced since) in the oldest."""
    versions = list(table_versions())
    for key, (_whose, settings, _note) in FOREIGN_FLAGS.items():
        for setting in settings:
            assert any(sglang_equivalent(setting, v) for v in (versions[-1], versions[0])), (key, setting)
        # and no foreign name is one SGLang itself accepts (it would be caught here instead of passed on)
        for v in versions:
            assert flag_in(key, v, prefix=False) is None, (key, v)


def test_typos_and_other_versions_flags():
    assert _errors("disable_custm_all_reduce: true") == [
        "experiment.yaml:7: server.base.disable_custm_all_reduce: unknown SGLang flag 'disable_custm_all_reduce' "
        "(did you mean 'disable_custom_all_reduce'?)"
    ]
    (e,) = _errors("gpu_memory_utilisation: 0.8")  # a typo of a vLLM name: both said
    assert "did you mean 'gpu_memory_utilization'? that is vLLM's; SGLang's is mem_fraction_static" in e
    (e,) = _errors("speculative_dflash_block_size: 8", version="0.5.9")
    assert "SGLang 0.5.9 has no flag 'speculative_dflash_block_size' (added in 0.5.11" in e
    assert "raise sglang_version" in e


def test_a_forked_builds_flag_needs_extra_flags():
    (e,) = _errors("ddtree_budget: 16")
    assert e.startswith("experiment.yaml:7: server.base.ddtree_budget: unknown SGLang flag 'ddtree_budget'")
    assert "name it in launcher.extra_flags" in e
    exp = parse_experiment(_yaml("ddtree_budget: 16", launcher="emulator: true, extra_flags: [ddtree-budget]"))
    assert exp.server_configs()[0][0].flags["ddtree_budget"] == 16  # untyped, as written
    # a name of extra_flags is the fork's own, never read as a prefix of one of SGLang's (enable_mix would set
    # enable_mixed_chunk)
    assert flag_in("enable_mix", "0.5.23").field == "enable_mixed_chunk"
    exp = parse_experiment(_yaml("enable_mix: 1", launcher="emulator: true, extra_flags: [enable_mix]"))
    flags = exp.server_configs()[0][0].flags
    assert flags["enable_mix"] == 1 and "enable_mixed_chunk" not in flags
    assert _errors("ddtree_budget: 16", launcher="emulator: true, extra_flags: ['two words']")[0] == (
        "experiment.yaml:5: launcher.extra_flags: 'two words' is not a flag name (letters, digits, '_' or '-', "
        "e.g. ddtree_budget)"
    )
    (e,) = _errors("", launcher="command: [vllm, serve, '{model_path}'], extra_flags: [x]")
    assert "launcher.extra_flags is for SGLang" in e


def test_emulator_flags_only_with_the_emulator():
    assert _errors("sim_load_time: 0.5") == []
    assert _errors("sim_load_time: 0.5", launcher="emulator: false") == [
        "experiment.yaml:7: server.base.sim_load_time: 'sim_load_time' is an emulator flag (servesweep sim); "
        "launcher.emulator is not true"
    ]


def test_plan_exits_2_and_prints_where(tmp_path):
    """What the user runs: `servesweep plan` on the issue's file fails before any server is touched."""
    f = tmp_path / "vllm-names.yaml"
    f.write_text(_yaml("gpu_memory_utilization: 0.85"))
    r = CliRunner().invoke(main, ["plan", str(f)])
    assert r.exit_code != 0
    out = " ".join(r.output.split())
    assert "vllm-names.yaml:7: server.base.gpu_memory_utilization: not an SGLang flag" in out, r.output
    assert "SGLang's is mem_fraction_static" in out
