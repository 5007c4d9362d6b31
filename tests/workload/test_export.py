"""`servesweep prompts --export`: the pool as SGLang bench_serving's and vLLM's custom datasets, read back with the
peers' own loading code where it can run here, and holding exactly the pool's prompts."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import types
import zipfile
from argparse import Namespace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from servesweep.cli.prompts import command
from servesweep.workload.export import export_pool, prompt_texts, rows
from servesweep.workload.pool import NONCE_SLOT
from servesweep.workload.prompts import build_pool
from servesweep.workload.tokenizer import load_tokenizer

TOK = load_tokenizer()
OVERHEAD = 8  # ChatML overhead of the built-in tokenizer, as servesweep's probe measures it


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return build_pool(600, 12, seed=3, template_overhead=OVERHEAD, cache_dir=tmp_path_factory.mktemp("pc"))


def expected(pool, nonce_start=0):
    """The pool's prompts as servesweep sends them, nonce i = the pool's nonce stream from nonce_start."""
    nonces = pool.nonces(nonce_start)
    return [p.messages[0]["content"].replace(NONCE_SLOT, next(nonces).decode()) for p in pool]


# ---- SGLang 0.5.23: its own sample_custom_requests ----------------------------------------------------------------


def _sglang_files(tmp: Path) -> Path | None:
    """sglang/benchmark/ of the sglang 0.5.23 wheel: .peer/ (bench/gpu/fetch_peer.sh) or a pip download; None: offline."""
    repo = Path(__file__).resolve().parents[2]
    if (repo / ".peer/sglang/benchmark/datasets/custom.py").exists():
        return repo / ".peer"
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(tmp / "dl"),
                "sglang==0.5.23",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    whl = next((tmp / "dl").glob("sglang-0.5.23-*.whl"))
    with zipfile.ZipFile(whl) as z:
        z.extractall(tmp, members=[n for n in z.namelist() if n.startswith("sglang/benchmark/")])
    return tmp


@pytest.fixture(scope="module")
def sglang_loader(tmp_path_factory):
    """sglang 0.5.23's `sample_custom_requests` (sglang/benchmark/datasets/custom.py), its modules loaded from the
    wheel's files (custom.py, common.py, utils.py run as they are) under bare packages; `transformers` (a type
    annotation and utils.py's imports there) stubbed when it is not installed."""
    root = _sglang_files(tmp_path_factory.mktemp("sglang"))
    if root is None:
        pytest.fail("sglang 0.5.23 wheel could not be downloaded from the package index")
    saved = {
        k: v
        for k, v in sys.modules.items()
        if k == "sglang" or k.startswith("sglang.") or k == "transformers"
    }
    # bare packages: sglang's __init__ imports the runtime, datasets/__init__ every dataset module (PIL, pybase64...)
    for name, sub in (
        ("sglang", ""),
        ("sglang.benchmark", "/benchmark"),
        ("sglang.benchmark.datasets", "/benchmark/datasets"),
    ):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root / "sglang") + sub]
        sys.modules[name] = pkg
    try:
        import transformers  # noqa: F401
    except ImportError:
        tf = types.ModuleType("transformers")
        for name in (
            "PreTrainedTokenizerBase",
            "AutoProcessor",
            "AutoTokenizer",
            "PreTrainedTokenizer",
            "PreTrainedTokenizerFast",
        ):
            setattr(tf, name, type(name, (), {}))
        sys.modules["transformers"] = tf
    import importlib

    custom = importlib.import_module("sglang.benchmark.datasets.custom")
    yield custom
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.") or k == "transformers"]:
        del sys.modules[k]
    sys.modules.update(saved)


def test_sglang_loader_reads_exactly_the_pool(pool, tmp_path, sglang_loader):
    out = tmp_path / "pool.jsonl"
    assert export_pool(pool, "sglang", out) == len(pool)
    args = Namespace(
        dataset_path=str(out),
        num_prompts=len(pool),
        sharegpt_output_len=128,
        sharegpt_context_len=None,
        prompt_suffix="",
        apply_chat_template=False,
    )
    random.seed(0)
    got = sglang_loader.CustomDataset.from_args(args).load(tokenizer=TOK)
    assert sorted(r.prompt for r in got) == sorted(expected(pool))  # bench_serving shuffles
    assert {r.output_len for r in got} == {128}
    # its prompt_len is the content's tokens (no template): the pool's length less the template overhead
    assert {r.prompt_len for r in got} == {600 - OVERHEAD}


@pytest.mark.fast
def test_sglang_format_minimal_reader(pool, tmp_path):
    """The same file read as sglang 0.5.23's sample_custom_requests does (sglang/benchmark/datasets/custom.py):
    JSON per line, 'conversations' (or 'conversation'), turn 0 the prompt, 'content' or 'value'; rows of under 2
    turns dropped. Runs offline."""
    out = tmp_path / "pool.jsonl"
    export_pool(pool, "sglang", out)
    prompts = []
    for line in out.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        convs = d.get("conversations", d.get("conversation", []))
        assert len(convs) >= 2
        prompts.append(convs[0].get("content", convs[0].get("value", "")))
        assert (
            len(TOK.encode(convs[1]["value"])) >= 2
        )  # else their loader drops the row without an output length
    assert prompts == expected(pool)
    assert all(len(TOK.encode(t)) + OVERHEAD == p.tokens for t, p in zip(prompts, pool, strict=True))


@pytest.mark.fast
def test_vllm_format_reader(pool, tmp_path):
    """Read as vLLM's CustomDataset.load_data does (vllm-project/vllm vllm/benchmarks/datasets/custom.py, commit
    237145e: pd.read_json(path, lines=True), a 'prompt' column required, rows as dicts). vLLM itself needs its GPU
    stack to import, so its few lines are followed here."""
    out = tmp_path / "pool.jsonl"
    assert export_pool(pool, "vllm", out, nonce_start=500) == len(pool)
    df = pd.read_json(path_or_buf=str(out), lines=True)
    assert "prompt" in df.columns
    data = [row.to_dict() for _, row in df.iterrows()]
    assert [d["prompt"] for d in data] == expected(pool, 500)
    with pytest.raises(ValueError, match="jsonl"):
        export_pool(pool, "vllm", tmp_path / "pool.json")


@pytest.mark.fast
def test_nonces_distinct_and_exact_lengths(pool):
    texts = list(prompt_texts(pool, 7))
    assert len({t[: pool.nonce_digits] for t in texts}) == len(pool)
    assert len(set(texts) & set(prompt_texts(pool, 1000))) == 0  # another start: no shared prompt
    assert all(NONCE_SLOT not in t for t in texts)


@pytest.mark.fast
def test_refuses_system_messages_and_unknown_format(tmp_path):
    sp = build_pool(600, 2, shared_prefix_tokens=100, template_overhead=OVERHEAD, cache_dir=None)
    with pytest.raises(ValueError, match="system"):
        list(rows(sp, "sglang"))
    with pytest.raises(ValueError, match="format"):
        list(rows(sp, "bogus"))
    comp = build_pool(600, 2, endpoint="completions", cache_dir=None)
    assert [r["prompt"] for r in rows(comp, "vllm")] == [
        p.text.replace(NONCE_SLOT, n) for p, n in zip(comp, ["00000000", "10000000"], strict=True)
    ]


@pytest.mark.fast
def test_cli_export(tmp_path):
    out = tmp_path / "p.jsonl"
    r = CliRunner().invoke(
        command,
        [
            "--prompt-tokens",
            "600",
            "-n",
            "3",
            "--template-overhead",
            "8",
            "--cache-dir",
            str(tmp_path / "c"),
            "--export",
            "vllm",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["exported"] == 3
    assert len(out.read_text().splitlines()) == 3
    r = CliRunner().invoke(command, ["--prompt-tokens", "600", "--export", "vllm"])
    assert r.exit_code != 0 and "--out" in r.output
