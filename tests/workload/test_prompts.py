"""Prompt pools: exact token counts as the server counts them, nonces, shared prefixes, determinism, disk cache,
and the template probe against a real emulator process."""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.request

import pytest
from support import byte_level_bpe, metaspace_tokenizer

from servesweep.sim.launch import start_sim
from servesweep.target.probes import probe_template_overhead
from servesweep.workload.pool import NONCE_SLOT, Nonces, nonce_scheme, nonce_tokens
from servesweep.workload.prompts import build_pool
from servesweep.workload.tokenizer import load_tokenizer, render_chatml

TOK = load_tokenizer()
USER_HEAD = len(TOK.encode("<|im_start|>user\n"))  # tokens before the user content in ChatML


def server_count(prompt, nonce: str) -> int:
    """As the emulator counts: chat → render_chatml + encode; completions → encode the text."""
    r = prompt.render(nonce)
    return len(TOK.encode(render_chatml(r) if isinstance(r, list) else r))


def request_ids(prompt, nonce: bytes) -> list[int]:
    """Token ids of the request the load generator would send (head + nonce + tail), as the server sees them."""
    body = json.loads(prompt.body("m", 16, nonce))
    if "messages" in body:
        return TOK.encode(render_chatml(body["messages"]))
    return TOK.encode(body["prompt"])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("prompt-cache")


@pytest.fixture(scope="module")
def pools(cache_dir):
    """Big pools once per module (the disk cache makes a re-run cheap)."""
    return {
        (3000, 0): build_pool(3000, 16, seed=0, cache_dir=cache_dir),
        (3000, 7): build_pool(3000, 16, seed=7, cache_dir=cache_dir),
        (30000, 1): build_pool(30000, 6, seed=1, cache_dir=cache_dir),
        (100000, 2): build_pool(100000, 3, seed=2, cache_dir=cache_dir),
    }


@pytest.mark.fast
@pytest.mark.parametrize("key", [(3000, 0), (3000, 7), (30000, 1), (100000, 2)])
def test_chat_prompts_have_the_exact_length_with_any_nonce(pools, key):
    target = key[0]
    pool = pools[key]
    assert pool.prompt_tokens == target and pool.nonce_digits == 8 and pool.nonce_tokens == 8
    assert pool.template_overhead == len(TOK.encode(render_chatml([{"role": "user", "content": ""}])))
    for p, nonce in zip(pool, ["00000000", "99999999", "31415926", "27182818"] * 8, strict=False):
        assert p.tokens == target
        assert server_count(p, nonce) == target


@pytest.mark.fast
def test_prompts_are_varied_text_with_a_needle_and_a_closing_question(pools):
    pool = pools[(30000, 1)]
    texts = [p.render("12345678")[0]["content"] for p in pool]
    for p, t in zip(pool, texts, strict=True):
        assert t.startswith("12345678\n")
        assert t.rstrip().endswith("Answer with the code only.")
        assert p.question in t and t.count(p.answer) == 1  # the needle is stated once, inside the filler
        needle_at = t.index(p.answer) / len(t)
        assert 0.0 < needle_at < 0.99
    # No paragraph repeats across prompts: a radix cache could not reuse one prompt's text for another.
    paragraphs = [set(t.split("\n\n")[:-1]) for t in texts]
    for i in range(len(paragraphs)):
        for j in range(i + 1, len(paragraphs)):
            assert not (paragraphs[i] & paragraphs[j])
    # Many topics and sentence shapes within one prompt.
    sentences = set(texts[0].replace("\n", " ").split(". "))
    assert len(sentences) > 0.9 * texts[0].count(". ")
    words = set(texts[0].lower().split())
    assert len(words) > 800


@pytest.mark.fast
def test_completions_and_overridden_overhead_are_exact(cache_dir):
    pool = build_pool(3000, 4, seed=3, endpoint="completions", cache_dir=cache_dir)
    for p in pool:
        assert p.messages is None and server_count(p, "55555555") == 3000
    # A server whose template adds 20 tokens around the content (a probe said so): content = 3000 - 20.
    pool = build_pool(3000, 4, seed=3, template_overhead=20, cache_dir=None)
    for p in pool:
        content = p.render("12345678")[0]["content"]
        assert 20 + len(TOK.encode(content)) == 3000
    # completions with a BOS-like overhead of 1
    pool = build_pool(3000, 2, seed=3, endpoint="completions", template_overhead=1, cache_dir=None)
    assert all(1 + len(TOK.encode(p.render("12345678"))) == 3000 for p in pool)


@pytest.mark.fast
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_short_prompts_are_exact_too(endpoint):
    """Any N: short prompts (no room for a needle) are a sentence or a few, still exactly N tokens."""
    for target in (26, 40, 64, 100, 128, 150, 256, 512):
        pool = build_pool(target, 3, seed=target, endpoint=endpoint, cache_dir=None)
        for p in pool:
            assert server_count(p, "31415926") == target
        if target >= 150:  # room for the needle and the question
            assert all(p.answer and p.question in p.as_text() for p in pool)
        if target <= 64:
            assert all(p.answer is None for p in pool)


@pytest.mark.fast
def test_k_digit_nonce_is_k_tokens_for_the_default_tokenizer():
    # Qwen's pre-tokenizer splits digits one per token, whatever surrounds them.
    for d in "0123456789":
        assert len(TOK.encode(d)) == 1
        assert TOK.encode("user\n" + d * 5 + "\nThe") == TOK.encode("user\n") + TOK.encode(
            d
        ) * 5 + TOK.encode("\nThe")
    for k in (1, 4, 8, 12):
        assert nonce_tokens(TOK, k) == k
    pool = build_pool(3000, 2, seed=5, nonce_digits=12, cache_dir=None)
    assert pool.nonce_tokens == 12
    nonces = Nonces(12, start=0)
    for _ in range(50):
        assert server_count(pool[0], next(nonces).decode()) == 3000


@pytest.mark.fast
def test_two_requests_from_one_prompt_differ_from_the_first_user_token(pools):
    p = pools[(3000, 0)][0]
    nonces = Nonces(8)
    seen_first = []
    prev = request_ids(p, next(nonces))
    for _ in range(30):
        ids = request_ids(p, next(nonces))
        assert len(ids) == 3000
        assert ids[:USER_HEAD] == prev[:USER_HEAD]  # only the template's opening is common
        assert ids[USER_HEAD] != prev[USER_HEAD]  # the very first user-content token differs
        seen_first.append(ids[USER_HEAD])
        prev = ids
    assert len(set(seen_first)) == 10  # every digit comes up as the first token
    # Streams from different processes start at random places.
    assert next(Nonces(8)) != next(Nonces(8)) or next(Nonces(8)) != next(Nonces(8))


@pytest.mark.fast
def test_body_parts_build_requests_fast_and_right(pools):
    pool = pools[(3000, 0)]
    head, tail = pool[0].body_parts("qwen", 256, extra={"ignore_eos": True, "stream": True})
    assert NONCE_SLOT.encode() not in head + tail
    body = json.loads(head + b"01234567" + tail)
    assert body["model"] == "qwen" and body["max_tokens"] == 256 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["role"] == "user" and body["messages"][0]["content"].startswith("01234567\n")
    assert pool[0].body_parts("qwen", 256, extra={"ignore_eos": True, "stream": True}) is not None
    assert pool.bodies("qwen", 256, extra={"ignore_eos": True, "stream": True})[0] == (head, tail)
    # The chat prompt as a raw completions / native generate request: same tokens as the chat rendering.
    comp = json.loads(pool[0].body("qwen", 8, b"01234567", endpoint="completions"))
    assert len(TOK.encode(comp["prompt"])) == 3000
    gen = json.loads(
        pool[0].body(
            "qwen", 8, b"01234567", endpoint="generate", extra={"sampling_params": {"ignore_eos": True}}
        )
    )
    assert (
        gen["sampling_params"] == {"max_new_tokens": 8, "ignore_eos": True}
        and len(TOK.encode(gen["text"])) == 3000
    )
    # No cache busting: no nonce slot, the whole body is the head.
    off = build_pool(3000, 2, seed=0, cache_bust=False, cache_dir=None)
    assert off.nonce_digits == 0 and next(off.nonces()) == b""
    h, t = off[0].body_parts("qwen", 16)
    assert t == b"" and server_count(off[0], "") == 3000
    with pytest.raises(ValueError, match="endpoint 'chat' needs a chat prompt"):
        build_pool(3000, 1, endpoint="completions", cache_dir=None)[0].body_parts("m", 1, endpoint="chat")


@pytest.mark.fast
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_shared_prefix_groups_share_exactly_p_tokens(endpoint):
    P, G = 1500, 3
    pool = build_pool(
        3000, 9, seed=4, shared_prefix_tokens=P, num_groups=G, endpoint=endpoint, cache_dir=None
    )
    assert [p.group for p in pool] == [i % G for i in range(9)]
    nonces = Nonces(8, start=123)
    ids = [request_ids(p, next(nonces)) for p in pool]
    assert all(len(x) == 3000 for x in ids)
    for i in range(9):
        for j in range(i + 1, 9):
            common = next((n for n, (a, b) in enumerate(zip(ids[i], ids[j], strict=True)) if a != b), 3000)
            if pool[i].group == pool[j].group:
                assert common == P, (i, j)
            else:  # other groups share no more than the template's opening
                assert common <= USER_HEAD
    # The same prompt twice: still shares only the prefix (the nonce follows it).
    a, b = request_ids(pool[0], b"11111111"), request_ids(pool[0], b"22222222")
    assert a[:P] == b[:P] and a[P] != b[P]
    with pytest.raises(ValueError, match="shared_prefix_tokens=5 is too small"):
        build_pool(3000, 2, shared_prefix_tokens=5, cache_dir=None)
    with pytest.raises(ValueError, match="must be smaller than prompt_tokens"):
        build_pool(3000, 2, shared_prefix_tokens=3000, cache_dir=None)


@pytest.mark.fast
def test_same_seed_same_bytes_other_seed_other_bytes(pools):
    a = build_pool(3000, 16, seed=0, cache_dir=None)  # rebuilt from nothing, not from the module's cache
    assert [x.body_parts("m", 8) for x in a] == [x.body_parts("m", 8) for x in pools[(3000, 0)]]
    b = pools[(3000, 7)]
    assert all(x.body_parts("m", 8) != y.body_parts("m", 8) for x, y in zip(a, b, strict=True))
    # Prompt i does not depend on n.
    assert build_pool(3000, 3, seed=0, cache_dir=None)[2].as_text() == a[2].as_text()
    # Another length, same seed: other text from the start, so one sweep point cannot warm the cache for the next.
    short = build_pool(2000, 1, seed=0, cache_bust=False, cache_dir=None)[0].render()[0]["content"]
    long_ = build_pool(3000, 1, seed=0, cache_bust=False, cache_dir=None)[0].render()[0]["content"]
    assert short[:40] != long_[:40]


def test_same_bytes_in_other_processes_whatever_their_hash_seed():
    """Locust workers are separate processes: without a disk cache they must still build the same prompts."""
    import os
    import subprocess
    import sys

    code = (
        "import hashlib; from servesweep.workload.prompts import build_pool; "
        "p = build_pool(2000, 4, seed=3, shared_prefix_tokens=600, num_groups=2, cache_dir=None); "
        "print(hashlib.sha256(b''.join(h + t for h, t in p.bodies('m', 8))).hexdigest())"
    )
    procs = [  # both at once: the test waits for the slower one only
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hs},
            stdout=subprocess.PIPE,
            text=True,
        )
        for hs in ("1", "2")
    ]
    try:
        digests = {p.communicate(timeout=120)[0].strip() for p in procs}
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs)
    here = build_pool(2000, 4, seed=3, shared_prefix_tokens=600, num_groups=2, cache_dir=None)
    assert digests == {hashlib.sha256(b"".join(h + t for h, t in here.bodies("m", 8))).hexdigest()}


@pytest.mark.fast
def test_disk_cache_hit_and_corrupt_file_rebuilt(tmp_path):
    t0 = time.perf_counter()
    first = build_pool(30000, 4, seed=9, cache_dir=tmp_path)
    t_build = time.perf_counter() - t0
    (f,) = tmp_path.glob("pool-*.json")
    t0 = time.perf_counter()
    again = build_pool(30000, 4, seed=9, cache_dir=tmp_path)
    t_hit = time.perf_counter() - t0
    assert [p.as_text() for p in again] == [p.as_text() for p in first]
    assert t_hit < t_build
    # Proof the file is what is read: a validly re-signed edit shows up.
    head, _, body = f.read_bytes().partition(b"\n")
    body = body.replace(f'"answer": "{first[0].answer}"'.encode(), b'"answer": "edited-0000"', 1)
    h = json.loads(head)
    h["sha256"] = hashlib.sha256(body).hexdigest()
    f.write_bytes(json.dumps(h).encode() + b"\n" + body)
    assert build_pool(30000, 4, seed=9, cache_dir=tmp_path)[0].answer == "edited-0000"
    # Damage that the checksum catches, a cut-off file, and garbage: each is rebuilt and rewritten.
    for damage in (
        lambda raw: raw.replace(b"the", b"teh", 1),
        lambda raw: raw[: len(raw) // 2],
        lambda raw: b"\x00garbage",
    ):
        f.write_bytes(damage(f.read_bytes()))
        rebuilt = build_pool(30000, 4, seed=9, cache_dir=tmp_path)
        assert [p.as_text() for p in rebuilt] == [p.as_text() for p in first]
        assert all(server_count(p, "00000000") == 30000 for p in rebuilt)
        assert build_pool(30000, 4, seed=9, cache_dir=tmp_path)[0].answer == first[0].answer
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.fast
def test_bad_arguments_name_the_parameter():
    for kw, msg in [
        (dict(prompt_tokens=0, n=1), "prompt_tokens=0"),
        (dict(prompt_tokens=100, n=0), "n=0"),
        (dict(prompt_tokens=3000, n=1, endpoint="embeddings"), "endpoint='embeddings'"),
        (dict(prompt_tokens=3000, n=1, num_groups=0), "num_groups=0"),
        (dict(prompt_tokens=3000, n=1, template_overhead=-1), "template_overhead=-1"),
        (dict(prompt_tokens=25, n=1), "prompt_tokens=25 leaves 8 tokens for the prompt body .* needs ≥ 9"),
    ]:
        with pytest.raises(ValueError, match=msg):
            build_pool(cache_dir=None, **kw)
    with pytest.raises(ValueError, match="tokenizer 'no/such/thing'"):
        build_pool(3000, 1, tokenizer="no/such/thing", cache_dir=None)


def train_bpe(path, corpus: list[str]) -> str:
    """A small byte-level BPE (no digit splitting: digits merge as the corpus makes them)."""
    return byte_level_bpe(path, corpus, vocab_size=2000, split_digits=False)


def test_another_tokenizer_that_merges_digits(tmp_path):
    """A tokenizer.json whose BPE merges digit runs: plain-digit nonces would change the length, so the pool
    writes them spaced out (" 1 2 3"), and counts stay exact under that tokenizer."""
    import random

    r = random.Random(0)
    words = "the harbor master repaired a broken rudder before spring tide while gulls circled".split()
    prose = [" ".join(r.choice(words) for _ in range(12)).capitalize() + "." for _ in range(3000)]
    numbers = [" ".join(str(r.randrange(10**6)) for _ in range(20)) for _ in range(2000)]
    spaced = [" ".join(str(r.randrange(10)) for _ in range(30)) for _ in range(500)]
    path = train_bpe(tmp_path / "bpe.json", prose + numbers + spaced)
    tok = load_tokenizer(path)
    assert len({len(tok.encode(x)) for x in ("12345678", "00000000", "98765432")}) > 1  # digits do merge
    assert nonce_scheme(tok, 8) == ("spaced", 8)
    for endpoint in ("chat", "completions"):
        pool = build_pool(3000, 3, tokenizer=path, endpoint=endpoint, cache_dir=tmp_path)
        assert pool.nonce_format == "spaced" and pool.nonce_tokens == 8
        nonces = pool.nonces()
        for p in pool:
            nonce = next(nonces).decode()
            assert re.fullmatch(r"( \d){8}", nonce)
            r_ = p.render(nonce)
            assert len(tok.encode(render_chatml(r_) if isinstance(r_, list) else r_)) == 3000
    # Without spaced digits in its vocabulary, no nonce format has a fixed length: a clear error.
    bad = load_tokenizer(train_bpe(tmp_path / "bad.json", prose + numbers))
    with pytest.raises(
        ValueError, match=r"a nonce of 8 digits takes a number of tokens that depends on the digits"
    ):
        nonce_scheme(bad, 8)
    with pytest.raises(ValueError, match="turn cache busting off"):
        build_pool(3000, 1, tokenizer=str(tmp_path / "bad.json"), cache_dir=None)


def test_a_metaspace_tokenizer_is_repaired_to_the_exact_length(tmp_path):
    """SentencePiece-style tokenizers mark word starts ("▁The") and do not add up sentence by sentence the way
    byte-level BPE does: the pool's check-and-recompose step still makes every prompt and prefix exact."""
    path = metaspace_tokenizer(tmp_path / "meta.json", capitalize=True)
    tok = load_tokenizer(path)
    assert tok.encode("The") == tok.encode(" The")  # the word-start mark: "add up by sentence" does not hold
    for endpoint in ("chat", "completions"):
        pool = build_pool(
            3000,
            4,
            tokenizer=path,
            endpoint=endpoint,
            shared_prefix_tokens=1000,
            num_groups=2,
            cache_dir=tmp_path,
        )
        nonces = pool.nonces()
        ids = []
        for p in pool:
            r_ = p.render(next(nonces).decode())
            ids.append(tok.encode(render_chatml(r_) if isinstance(r_, list) else r_))
        assert [len(x) for x in ids] == [3000] * 4
        assert ids[0][:1000] == ids[2][:1000] and ids[0][1000] != ids[2][1000]


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--enable-cache-report"]) as s:
        yield s


def post(url: str, body: bytes) -> dict:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_probe_template_overhead_against_the_emulator(sim):
    assert probe_template_overhead(sim.base_url, "m") == 8  # ChatML around one user message
    assert probe_template_overhead(sim.base_url + "/v1/", "m", system=True) == 13
    assert probe_template_overhead(sim.base_url, "m", endpoint="completions") == 0
    thinking_off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert probe_template_overhead(sim.base_url, "m", extra=thinking_off) == 8 + len(
        TOK.encode("<think>\n\n</think>\n\n")
    )
    with pytest.raises(RuntimeError, match="cannot reach"):
        probe_template_overhead("http://127.0.0.1:9", "m", timeout=5)


def test_probe_sends_the_api_key_and_never_repeats_it(tmp_path):
    key = "sk-test-" + "7" * 24
    cfg = tmp_path / "sim.yaml"  # the key in a file, not on a command line
    cfg.write_text(f"api-key: {key}\n")
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--config", str(cfg)]) as s:
        assert probe_template_overhead(s.base_url, "m", api_key=key) == 8
        with pytest.raises(RuntimeError, match="HTTP 401") as e:
            probe_template_overhead(s.base_url, "m", api_key="sk-wrong-" + "1" * 20)
        assert "sk-" not in str(e.value)


def test_server_counts_the_target_and_caches_nothing_but_the_shared_prefix(sim):
    """Through the emulator's usage: exact prompt tokens; cache hits only where a shared prefix asks for them."""
    url = sim.base_url + "/v1/chat/completions"
    pool = build_pool(3000, 4, seed=11, cache_dir=None)
    nonces = Nonces(8)
    cached = []
    for _ in range(2):  # every prompt twice: the second pass would hit the cache without the nonce
        for p in pool:
            u = post(url, p.body("m", 1, next(nonces), extra={"stream": False}))["usage"]
            assert u["prompt_tokens"] == 3000
            cached.append(u["prompt_tokens_details"]["cached_tokens"])
    assert sum(cached) / (3000 * len(cached)) <= 0.01
    # The same chat prompt through /v1/completions and SGLang's /generate (as its ChatML text): same count.
    p = pool[0]
    u = post(
        sim.base_url + "/v1/completions",
        p.body("m", 1, next(nonces), endpoint="completions", extra={"stream": False}),
    )
    assert u["usage"]["prompt_tokens"] == 3000
    g = post(
        sim.base_url + "/generate", p.body("m", 1, next(nonces), endpoint="generate", extra={"stream": False})
    )
    assert g["meta_info"]["prompt_tokens"] == 3000
    # Shared prefixes: after the first request of each group, every request hits exactly the P-token prefix,
    # so the steady-state hit rate is P / prompt_tokens (2000 / 3000), chat and completions alike.
    for endpoint, path in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
        shared = build_pool(
            3000, 6, seed=11, shared_prefix_tokens=2000, num_groups=2, endpoint=endpoint, cache_dir=None
        )
        hits = []
        for p in shared:
            u = post(sim.base_url + path, p.body("m", 1, next(nonces), extra={"stream": False}))["usage"]
            assert u["prompt_tokens"] == 3000
            hits.append(u["prompt_tokens_details"]["cached_tokens"])
        assert max(hits[:2]) <= 30 and hits[2:] == [2000] * 4, (endpoint, hits)


@pytest.mark.fast
def test_prompts_command_warms_the_cache_and_checks_datasets(tmp_path):
    from click.testing import CliRunner

    from servesweep.cli.prompts import command

    run = CliRunner().invoke
    r = run(command, ["--prompt-tokens", "3000", "-n", "4", "--cache-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert (s["n"], s["tokens_min"], s["tokens_max"], s["nonce_tokens"]) == (4, 3000, 3000, 8)
    assert len(list(tmp_path.glob("pool-*.json"))) == 1  # warmed: a run with these parameters reads it
    r = run(command, ["--prompt-tokens", "3000", "-n", "4", "--cache-dir", str(tmp_path), "--show", "2"])
    assert r.exit_code == 0 and '"content": "<NONCE>\\n' in r.output and "[needle answer: " in r.output
    good = tmp_path / "ok.jsonl"
    good.write_text('{"prompt": "Hello there."}\n{"prompt": "How long is a piece of string?"}\n')
    r = run(command, ["--dataset", str(good), "--json"])
    assert (
        r.exit_code == 0
        and json.loads(r.output)["source"] == f"dataset:{good}"
        and json.loads(r.output)["n"] == 2
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    r = run(command, ["--dataset", str(bad)])
    assert r.exit_code == 1 and f"Error: {bad}: line 2: 'prompt' must be a string" in r.output
    r = run(command, ["-n", "4"])
    assert r.exit_code == 2 and "give --prompt-tokens N" in r.output


@pytest.mark.fast
def test_cache_keeps_to_its_size_cap_dropping_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "SERVESWEEP_PROMPT_CACHE_MB", "0.15"
    )  # room for two 3k-token pools of 4 prompts (64 kB each)
    for seed in (1, 2):
        build_pool(3000, 4, seed=seed, cache_dir=tmp_path)
    first, second = sorted(tmp_path.glob("pool-*.json"), key=lambda f: f.stat().st_mtime)
    time.sleep(0.05)
    build_pool(3000, 4, seed=1, cache_dir=tmp_path)  # a hit: seed 1 becomes the most recently used
    build_pool(3000, 4, seed=3, cache_dir=tmp_path)  # over the cap: the least recently used (seed 2) goes
    left = set(tmp_path.glob("pool-*.json"))
    assert first in left and second not in left and len(left) == 2
