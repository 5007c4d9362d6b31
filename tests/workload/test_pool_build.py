"""Building a pool counts only its first prompts in full; every prompt still has the exact length, and a tokenizer
that does not add up by pieces is caught by those first prompts and every prompt is counted and repaired."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from click.testing import CliRunner
from support import byte_level_bpe, metaspace_tokenizer

from servesweep.workload import prompts
from servesweep.workload.pool import _SLOT_BYTES, NONCE_SLOT, _split_body
from servesweep.workload.prompts import build_pool, verify_pool
from servesweep.workload.tokenizer import load_tokenizer, render_chatml


def server_counts(tok, pool) -> list[int]:
    """Every prompt as the emulator counts it (ChatML + encode, or the raw text), with a nonce filled in."""
    nonces = pool.nonces()
    out = []
    for p in pool:
        r = p.render(next(nonces).decode())
        out.append(len(tok.encode(render_chatml(r) if isinstance(r, list) else r)))
    return out


@pytest.fixture
def counted(monkeypatch):
    """The number of prompts each call of the pool's full count got (a spy on the real function)."""
    calls: list[int] = []
    real = prompts.count_prompts

    def spy(tok, ps, overhead, nonce):
        calls.append(len(ps))
        return real(tok, ps, overhead, nonce)

    monkeypatch.setattr(prompts, "count_prompts", spy)
    return calls


def _sentences(n: int) -> list[str]:
    return prompts._generate_sentences(prompts._filler_data())[0][:n]


def _byte_level_bpe(path) -> str:
    """A byte-level BPE with the GPT-2 split regex and one token per digit, trained on the filler's sentences."""
    return byte_level_bpe(path, _sentences(4000), vocab_size=3000, split_digits=True)


def _word_level(path) -> str:
    """A word-level tokenizer (what the peer benchmark gives every tool)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"])
    tk.train_from_iterator(_sentences(4000) + [" ".join("0123456789")], trainer)
    tk.save(str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["qwen3.6", "byte-level-bpe", "word-level"])
def test_only_the_first_prompts_are_counted_and_every_prompt_is_exact(tmp_path, monkeypatch, counted, kind):
    spec = {"qwen3.6": lambda p: "qwen3.6", "byte-level-bpe": _byte_level_bpe, "word-level": _word_level}[
        kind
    ](tmp_path / "tokenizer.json")
    tok = load_tokenizer(spec)
    monkeypatch.setattr(prompts, "_CANARY_TOKENS", 20_000)  # one 20k-token prompt
    for endpoint in ("chat", "completions"):
        counted.clear()
        pool = build_pool(20_000, 6, tokenizer=spec, endpoint=endpoint, seed=3, cache_dir=None)
        assert counted == [1]  # the first prompt in full; the other five at their composed length
        assert pool.meta()["counted_in_full"] == 1
        assert [p.tokens for p in pool] == [20_000] * 6
        assert server_counts(tok, pool) == [20_000] * 6
        assert verify_pool(pool) == {}


@pytest.mark.fast
def test_shared_prefix_pools_count_the_first_prompt_of_every_group(monkeypatch, counted):
    monkeypatch.setattr(prompts, "_CANARY_TOKENS", 1)
    tok = load_tokenizer()
    pool = build_pool(12_000, 8, shared_prefix_tokens=3000, num_groups=3, cache_dir=None)
    assert counted == [3]  # prompts 0, 1, 2: one of each group
    assert server_counts(tok, pool) == [12_000] * 8
    heads = [tok.encode(render_chatml(p.render("0" * p.nonce_digits))) for p in pool]
    assert heads[0][:3000] == heads[3][:3000] and heads[0][:3000] != heads[1][:3000]


def test_a_tokenizer_that_does_not_add_up_is_caught_and_every_prompt_repaired(tmp_path, monkeypatch, counted):
    """SentencePiece-style word-start marks: a paragraph's first sentence counts one way alone and another after a
    paragraph break. The first prompt shows it; then every prompt is counted and the ones off are recomposed."""
    path = metaspace_tokenizer(tmp_path / "meta.json", capitalize=False)
    tok = load_tokenizer(path)
    monkeypatch.setattr(prompts, "_CANARY_TOKENS", 1)
    pool = build_pool(3000, 5, tokenizer=path, cache_dir=None)
    assert counted[:2] == [1, 4]  # the first prompt was off: the other four were counted too
    assert len(counted) > 2  # ... and some were recomposed and counted again
    assert pool.counted_in_full == 5
    assert server_counts(tok, pool) == [3000] * 5


@pytest.mark.fast
def test_prompts_verify_counts_every_prompt_and_names_the_ones_off(tmp_path):
    from servesweep.cli.prompts import command

    runner = CliRunner()
    args = ["--prompt-tokens", "5000", "-n", "4", "--cache-dir", str(tmp_path), "--json"]
    res = runner.invoke(command, [*args, "--verify"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["verified_prompts"] == 4 and got["tokens_min"] == got["tokens_max"] == 5000
    assert got["counted_in_full"] == 4  # 4 x 5k tokens: all of them (the first 200k tokens are)
    again = json.loads(runner.invoke(command, args).output)  # from the disk cache: the same record
    assert again["counted_in_full"] == 4 and "verified_prompts" not in again

    # A cached pool whose prompt 2 is off (one sentence longer than it says): --verify names it.
    (path,) = tmp_path.glob("pool-*.json")
    head, body = path.read_bytes().split(b"\n", 1)
    d = json.loads(body)
    msg = d["prompts"][2]["messages"][-1]
    old = msg["content"]
    msg["content"] = old.replace("Question:", "The tide was high. Question:", 1)
    tok = load_tokenizer()
    off = 5000 + len(tok.encode(msg["content"])) - len(tok.encode(old))
    assert off > 5000
    body = json.dumps(d, ensure_ascii=False).encode()
    h = json.loads(head) | {"sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(json.dumps(h).encode() + b"\n" + body)
    assert runner.invoke(command, args).exit_code == 0  # without --verify the pool is taken as it says
    res = runner.invoke(command, [*args, "--verify"])
    assert res.exit_code != 0
    assert f"1 of 4 prompts are off: prompt 2: {off} tokens, not 5000" in res.output


def test_a_cached_pool_is_read_without_loading_the_tokenizer(tmp_path):
    """A Locust process finds the pool that `servesweep load` built: it must not spend a second or two loading a
    large tokenizer.json just to name the cache file. Fresh processes, as in a run."""
    import subprocess
    import sys

    path = _byte_level_bpe(tmp_path / "tokenizer.json")
    code = (
        "import sys; from servesweep.workload.prompts import build_pool; from servesweep.workload.tokenizer import load_tokenizer;"
        f"p = build_pool(4000, 3, tokenizer={path!r}, cache_dir={str(tmp_path / 'cache')!r});"
        "print(load_tokenizer.cache_info().currsize, sorted({x.tokens for x in p}))"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True) for _ in "ab"
    ]
    assert [r.stdout.split(maxsplit=1) for r in runs] == [["1", "[4000]\n"], ["0", "[4000]\n"]]
    # the template probe's content count too (`servesweep load` probes, then finds the pool cached)
    probe = (
        "from servesweep.workload.prompts import _content_tokens; from servesweep.workload.tokenizer import load_tokenizer;"
        f"print(load_tokenizer.cache_info().currsize, _content_tokens({path!r}, ['Reply.', 'You are a test.']),"
        "load_tokenizer.cache_info().currsize)"
    )
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    got = [
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
        ).stdout
        for _ in "ab"
    ]
    n = len(load_tokenizer(path).encode("Reply.")) + len(load_tokenizer(path).encode("You are a test."))
    assert got == [f"0 {n} 1\n", f"0 {n} 0\n"]
    # another tokenizer file at the same path is another cache entry: built again, with the new file
    tj = tmp_path / "tokenizer.json"
    tj.write_text(tj.read_text() + "\n")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert again.stdout.split(maxsplit=1) == ["1", "[4000]\n"]


@pytest.mark.parametrize(
    "content",
    [
        "plain text\nwith a paragraph break",
        f"{NONCE_SLOT}\nthe nonce slot first",
        f'before {NONCE_SLOT} after, and a tab\tand a quote " here',
        f"non-ASCII: café, 中文, emoji 🚀 {NONCE_SLOT} end",
        f"a control character \x01 {NONCE_SLOT}",
        "a literal backslash-u: \\ue000 and no slot",
        f"a literal \\ue000 and the slot {NONCE_SLOT}",
        f"a backslash \\ and the slot {NONCE_SLOT}",
    ],
)
@pytest.mark.fast
def test_request_bodies_are_utf8_json_split_at_the_nonce(content):
    obj = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    want = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode().split(_SLOT_BYTES)
    head, tail = _split_body(obj)
    assert [head, tail] == (want if len(want) == 2 else [*want, b""])
    nonce = "12345678" if NONCE_SLOT in content else ""
    got = json.loads(head + nonce.encode() + tail)["messages"][0]["content"]
    assert got == content.replace(NONCE_SLOT, nonce)


@pytest.mark.fast
def test_a_prompt_with_two_nonce_slots_is_an_error():
    obj = {"prompt": f"{NONCE_SLOT} and {NONCE_SLOT}"}
    with pytest.raises(ValueError, match="holds the nonce slot 2 times"):
        _split_body(obj)
