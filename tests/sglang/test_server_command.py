"""The server's command line is built in one place (sglang/server_command.py) and the role only writes it out: what
`servesweep run` starts for SGLang, the emulator and a generic server, with the flags spelled for the version."""

import pytest

from servesweep.sglang.server_command import ServerLaunch

pytestmark = pytest.mark.fast


def _launch(**over) -> ServerLaunch:
    base = dict(
        kind="sglang",
        launcher="process",
        python="/opt/sglang/bin/python",
        model_path="Qwen/Qwen3.6-27B",
        port=30001,
        bind="127.0.0.1",
        workdir="/srv/ss/p30001",
        version="0.5.23",
        flags={"tp_size": 2, "mamba_radix_cache_strategy": "extra_buffer", "enable_metrics": True},
    )
    return ServerLaunch(**{**base, **over})


def test_sglang_argv_spells_the_flags_for_the_version_and_keeps_the_key_in_a_file():
    argv = _launch(api_key=True, served_model_name="qwen").argv()
    assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert argv[3:11] == ["--model-path", "Qwen/Qwen3.6-27B", "--host", "127.0.0.1", "--port", "30001",
                          "--served-model-name", "qwen"]
    assert "--enable-metrics" in argv and argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert argv[-2:] == ["--config", "/srv/ss/p30001/secret.yaml"]
    # 0.5.11 knew the same setting under its older option string
    old = _launch(version="0.5.11").argv()
    assert "--mamba-scheduler-strategy" in old and "--mamba-radix-cache-strategy" not in old
    assert "--config" not in old  # no key, no config file


def test_docker_listens_on_all_interfaces_and_reads_the_key_from_its_mount():
    argv = _launch(launcher="docker", api_key=True).argv()
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[-2:] == ["--config", "/run/servesweep/secret.yaml"]


def test_emulator_argv_has_its_sim_options_and_the_power_limit_stand_in():
    argv = _launch(
        kind="emulator",
        sim_gpu="H200",
        sim_args={"sim_load_time": 0.2},
        extra_spec_algorithms=["DFLASH"],
        flags={"tp_size": 1, "gpu_power_limit_w": 450},
    ).argv()
    assert argv[:5] == ["/opt/sglang/bin/python", "-m", "servesweep.sim", "--sim-sglang-version", "0.5.23"]
    for pair in (["--sim-gpu", "H200"], ["--sim-extra-spec-algorithms", "DFLASH"],
                 ["--sim-nvml-state", "/srv/ss/p30001/sim_nvml.json"], ["--sim-load-time", "0.2"]):
        assert argv[argv.index(pair[0]) + 1] == pair[1]
    assert "--gpu-power-limit-w" not in argv  # a host setting the role applies, no server flag


def test_generic_template_is_filled_and_its_flags_keep_their_names():
    argv = _launch(
        kind="generic",
        version="",
        python="/opt/vllm/bin/python",
        command=["{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model_path}",
                 "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}",
                 "--api-key-file={api_key_file}"],
        flags={"max_num_seqs": 8},
    ).argv()
    assert argv == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                    "Qwen/Qwen3.6-27B", "--served-model-name", "Qwen/Qwen3.6-27B", "--host", "127.0.0.1",
                    "--port", "30001", "--api-key-file=/srv/ss/p30001/secret.key", "--max-num-seqs", "8"]


def test_an_unknown_placeholder_is_named():
    with pytest.raises(ValueError, match=r"unknown placeholder \{gpu\} .*known: \{python\}"):
        _launch(kind="generic", command=["serve", "--gpu", "{gpu}"]).argv()
