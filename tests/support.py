"""Helpers shared by the tests that run whole matrices on the emulator (imported as `support`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]


@contextlib.contextmanager
def refused_port(host: str = "127.0.0.1"):
    """A port of `host` that refuses every connection for as long as the block runs: a socket bound to it that never
    listens holds it (connect() gets a reset), so no other process can take it meanwhile. A port that was merely free
    a moment ago is not dead: under xdist another test's server or Locust web UI binds it and answers (CI: the "dead"
    run's second point read `/v1/models did not answer JSON` and was failed, not server_failed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        yield s.getsockname()[1]


def emulator_experiment_head(tmp: Path, name: str, *, load_time: float = 0.2, needle_probes: bool = False) -> str:
    """The start of an experiment file that runs on the emulator on this machine, up to `server.base`; the caller
    appends the rest (bundles under `server:`, then `load:` ...). Needle probes are off unless asked for: at real
    time the emulator's greedy answers (EOS after a lognormal draw of median 200 tokens) cost 5-30 s per server
    start, and only tests/matrix/test_answer_probes.py and the secrets tests (the key reaches the probes) need them."""
    answers = "" if needle_probes else "        answers: {needle_probes: false}\n"  # indented as the lines it joins
    return textwrap.dedent(
        f"""\
        name: {name}
        sglang_version: 0.5.23
        target: {{inventory: local, port: 0}}
        model: {{path: Qwen/Qwen3.6-27B}}
{answers}        launcher:
          emulator: true
          gpu: H200
          workdir: {tmp / "srv"}
          startup_timeout_s: 120
          stop_timeout_s: 20
          sim_args: {{sim_load_time: {load_time}}}
        server:
          base: {{context_length: 4096, max_running_requests: 8}}
        """
    )


def start_servesweep(args: list[str], cwd: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    """`servesweep ARGS` in its own session (so a test can SIGKILL it alone), output to `log`."""
    return subprocess.Popen(
        SERVESWEEP + args,
        cwd=cwd,
        stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
    )


def run_servesweep(*args: str, timeout: float, cwd: Path | None = None, columns: int = 250) -> tuple[int, str]:
    """`servesweep ARGS` to its end, in its own process group, so that on a timeout the cleanup reaches the
    emulators and Locust processes it started too; (exit code, stdout and stderr together)."""
    import signal

    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "servesweep"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": str(columns)},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def metaspace_tokenizer(path: Path, *, capitalize: bool) -> str:
    """A small SentencePiece-style BPE (`tokenizer.json` at `path`): word-start marks, so a sentence counts one way
    alone and another after a space, and prompts do not add up by sentence. Trained on seeded prose of 12-word
    sentences (capitalized or not); returns the path as a string."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    r = random.Random(0)
    words = "the harbor master repaired a broken rudder before spring tide while gulls circled".split()
    prose = []
    for _ in range(3000):
        s = " ".join(r.choice(words) for _ in range(12))
        prose.append((s.capitalize() if capitalize else s) + ".")
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tk.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,?:-'\n "),
        show_progress=False,
    )
    tk.train_from_iterator(prose, trainer)
    tk.save(str(path))
    return str(path)


def byte_level_bpe(path: Path, corpus: list[str], *, vocab_size: int, split_digits: bool) -> str:
    """A small byte-level BPE `tokenizer.json` at `path` trained on `corpus` (the family of Llama 3, Qwen and GPT
    tokenizers); `split_digits`: one token per digit, as Qwen's pre-tokenizer does (else digits merge as the corpus
    makes them). Returns the path as a string."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus, trainer)
    tk.save(str(path))
    return str(path)


def completed_by_emulator(sim, prompt_tokens: int) -> set[str]:
    """Request ids (X-Request-Id) whose stream the emulator finished, of the requests with this prompt length
    (used by both test sessions: tests/client and tests/inlocust)."""
    return {
        d["id"]
        for d in sim.ground_truth_so_far()
        if d.get("prompt_tokens")
        and abs(d["prompt_tokens"] - prompt_tokens) <= 3
        and d.get("status") == 200
        and d.get("completion_tokens")
    }


def with_server_argv(v: dict, *, command: list[str] | None = None, sim_args: dict | None = None) -> dict:
    """Role variables `v` plus the command line the controller hands the sglang_server role (`sglang_server_argv`,
    built by servesweep.sglang.server_command as `servesweep run` builds it): the tests that apply the role
    directly give it what the orchestrator would. `command`: a generic server's argv template."""
    from servesweep.sglang.server_command import ServerLaunch

    generic = bool(command)
    launch = ServerLaunch(
        kind="generic" if generic else "emulator" if v.get("sglang_server_emulator") else "sglang",
        launcher=v.get("sglang_server_launcher", "process"),
        python=v.get("sglang_server_python", "python3"),
        model_path=v.get("sglang_server_model_path", ""),
        served_model_name=v.get("sglang_server_served_model_name", ""),
        port=int(v.get("sglang_server_port", 30000)),
        bind=v.get("sglang_server_bind", "127.0.0.1"),
        workdir=v.get("sglang_server_workdir", "/tmp/servesweep-server"),
        version="" if generic else v.get("sglang_server_version", "0.5.23"),
        flags=v.get("sglang_server_flags", {}),
        command=command or (),
        sim_gpu=v.get("sglang_server_sim_gpu", ""),
        sim_args=sim_args or {},
        api_key=bool(v.get("sglang_server_api_key_env")) and bool(os.environ.get(v["sglang_server_api_key_env"])),
    )
    return {**v, "sglang_server_argv": launch.argv(), "sglang_server_generic": generic}
