"""Dataset files (ShareGPT JSON, JSONL): parsing, token counts as the server counts them, filters, sampling, and
errors that name the file, the line or record, and what is wrong."""

from __future__ import annotations

import json
import re

import pytest

from servesweep.workload.datasets import DatasetError, load_dataset
from servesweep.workload.pool import NONCE_SLOT, Nonces
from servesweep.workload.tokenizer import load_tokenizer, render_chatml

TOK = load_tokenizer()
WORDS = "river lantern copper meadow harbor quiet winter garden silver market bridge orchard".split()


def text_of(n_words: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n_words)) + "."


def sharegpt_records() -> list[dict]:
    recs = []
    for i in range(40):
        conv = []
        if i % 5 == 0:
            conv.append({"from": "system", "value": "You answer briefly."})
        conv.append({"from": "human", "value": f"Question {i}: " + text_of(10 + 12 * i, i)})
        conv.append({"from": "gpt", "value": text_of(5 + i, i + 1)})
        conv.append({"from": "human", "value": "And then?"})
        conv.append({"from": "gpt", "value": "Nothing more."})
        recs.append({"id": str(i), "conversations": conv})
    recs.append({"conversations": []})  # empty conversations exist in real dumps: skipped
    recs.append(
        {"conversations": [{"from": "gpt", "value": "Hello, how can I help?"}]}
    )  # no human turn: skipped
    recs.append(
        {"conversations": [{"from": "gpt", "value": "Hi."}, {"from": "human", "value": "Tell me a story."}]}
    )
    return recs


@pytest.fixture
def sharegpt(tmp_path):
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(sharegpt_records(), indent=1))
    return p


@pytest.fixture
def jsonl(tmp_path):
    p = tmp_path / "prompts.jsonl"
    lines = [
        json.dumps({"prompt": f"Item {i}. " + text_of(8 + 9 * i, i), "output_tokens": 50 + i})
        for i in range(30)
    ]
    lines.insert(5, "")  # blank lines are fine
    lines.append(
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "Be terse."},
                    {"role": "user", "content": "Hi there."},
                ]
            }
        )
    )
    p.write_text("\n".join(lines) + "\n")
    return p


def chat_count(prompt, nonce: str) -> int:
    return len(TOK.encode(render_chatml(prompt.render(nonce))))


@pytest.mark.fast
def test_sharegpt_prompts_are_the_first_human_turn_with_exact_counts(sharegpt):
    pool = load_dataset(sharegpt)
    assert len(pool) == 41 and pool.prompt_tokens is None and pool.nonce_digits == 8
    assert pool.source == f"dataset:{sharegpt}"
    first = pool[0]
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.messages[1]["content"].startswith(NONCE_SLOT + "\nQuestion 0: ")
    assert first.output_tokens == len(TOK.encode(text_of(5, 1)))  # the gpt reply that follows
    assert [m["role"] for m in pool[1].messages] == ["user"]
    # the record that opened with a gpt turn keeps only its human turn; it has no reference answer
    assert pool[40].messages == [{"role": "user", "content": NONCE_SLOT + "\nTell me a story."}]
    assert pool[40].output_tokens is None
    nonces = Nonces(8)
    for p in pool:
        nonce = next(nonces).decode()
        assert p.tokens == chat_count(p, nonce)  # what the server will count, nonce included
    # request bodies like a synthetic pool's
    head, tail = pool[3].body_parts("m", 64, extra={"ignore_eos": True})
    body = json.loads(head + b"12345678" + tail)
    assert body["messages"][-1]["content"].startswith("12345678\nQuestion 3: ")


@pytest.mark.fast
def test_jsonl_prompt_and_messages_records(jsonl):
    pool = load_dataset(jsonl)
    assert len(pool) == 31
    assert pool[0].messages == [{"role": "user", "content": NONCE_SLOT + "\nItem 0. " + text_of(8, 0)}]
    assert pool[0].output_tokens == 50 and pool[29].output_tokens == 79
    assert [m["role"] for m in pool[30].messages] == ["system", "user"]
    assert all(p.tokens == chat_count(p, "00000000") for p in pool)
    # completions: raw text, counted raw
    only = jsonl.with_name("only.jsonl")
    only.write_text("\n".join(jsonl.read_text().splitlines()[:-1]) + "\n")
    comp = load_dataset(only, endpoint="completions")
    assert comp[0].text == NONCE_SLOT + "\nItem 0. " + text_of(8, 0)
    assert all(p.tokens == len(TOK.encode(p.render("99999999"))) for p in comp)
    with pytest.raises(
        DatasetError, match=rf"{re.escape(str(jsonl))}: line 32: chat messages need endpoint 'chat'"
    ):
        load_dataset(jsonl, endpoint="completions")
    # cache busting off: the text as given
    off = load_dataset(only, cache_bust=False)
    assert off[0].messages[0]["content"] == "Item 0. " + text_of(8, 0) and off.nonce_digits == 0
    assert off[0].body_parts("m", 8)[1] == b""
    # an overhead from a probe replaces ChatML's
    probed = load_dataset(only, template_overhead=20)
    assert all(p.tokens == 20 + len(TOK.encode(p.render("12345678")[0]["content"])) for p in probed)


@pytest.mark.fast
def test_length_filters_and_seeded_sampling(sharegpt):
    everything = load_dataset(sharegpt)
    lengths = sorted(p.tokens for p in everything)
    lo, hi = lengths[10], lengths[30]
    kept = load_dataset(sharegpt, min_prompt_tokens=lo, max_prompt_tokens=hi)
    assert len(kept) == sum(lo <= t <= hi for t in lengths) and all(lo <= p.tokens <= hi for p in kept)
    a = load_dataset(sharegpt, n=8, seed=1, min_prompt_tokens=lo, max_prompt_tokens=hi)
    b = load_dataset(sharegpt, n=8, seed=1, min_prompt_tokens=lo, max_prompt_tokens=hi)
    c = load_dataset(sharegpt, n=8, seed=2, min_prompt_tokens=lo, max_prompt_tokens=hi)
    assert len(a) == 8 and all(lo <= p.tokens <= hi for p in a)
    assert [p.messages for p in a] == [p.messages for p in b]
    assert [p.messages for p in a] != [p.messages for p in c]
    with pytest.raises(
        DatasetError, match=r"sg.json: \d+ of 41 prompts are .* tokens long, fewer than n=100"
    ):
        load_dataset(sharegpt, n=100, min_prompt_tokens=lo, max_prompt_tokens=hi)
    with pytest.raises(DatasetError, match=r"0 of 41 prompts are 100000\.\. tokens long"):
        load_dataset(sharegpt, min_prompt_tokens=100000)
    with pytest.raises(ValueError, match="min_prompt_tokens=50 is above max_prompt_tokens=10"):
        load_dataset(sharegpt, min_prompt_tokens=50, max_prompt_tokens=10)


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"prompt": "ok"}', '{"prompt": "broken"'],
            r"line 2: invalid JSON at column 20: Expecting ',' delimiter",
        ),
        (
            ['{"prompt": "ok"}', "", '{"text": "no prompt"}'],
            r"line 3: needs a 'prompt' \(string\) or 'messages'",
        ),
        (['{"prompt": 42}'], r"line 1: 'prompt' must be a string, found a int"),
        (['{"prompt": "a", "output_tokens": "many"}'], r"line 1: 'output_tokens' must be a positive integer"),
        (['["prompt"]'], r"line 1: expected a JSON object, found a list"),
        (['{"messages": "hi"}'], r"line 1: 'messages' must be a non-empty list"),
        (['{"messages": [{"role": "user"}]}'], r"line 1: messages\[0\]: missing field 'content'"),
        (
            ['{"messages": [{"role": "user", "content": 1}]}'],
            r"line 1: messages\[0\]: 'content' must be a string",
        ),
        (
            ['{"messages": [{"role": "robot", "content": "x"}]}'],
            r"line 1: messages\[0\]: unknown role 'robot'",
        ),
        (['{"messages": [{"role": "system", "content": "x"}]}'], r"line 1: 'messages' has no user message"),
    ],
)
@pytest.mark.fast
def test_malformed_jsonl_names_the_line(tmp_path, lines, message):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=re.escape(str(p)) + ": " + message):
        load_dataset(p)


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '[{"conversations": []}, {"conversations": [{"from": "human"}]}]',
            r"record 1: conversations\[0\]: missing field 'value'",
        ),
        (
            '[{"conversations": [{"from": "human", "value": ["x"]}]}]',
            r"record 0: conversations\[0\]: 'value' must be a string, found a list",
        ),
        (
            '[{"conversations": [{"from": "alien", "value": "x"}]}]',
            r"record 0: conversations\[0\]: unknown speaker 'from': 'alien'",
        ),
        ('[{"conversations": []}, {"turns": []}]', r"record 1: missing field 'conversations'"),
        (
            '[{"conversations": {"from": "human"}}]',
            r"record 0: 'conversations' must be a list, found a object",
        ),
        ('[{"conversations": []}, "text"]', r"record 1: expected an object, found a string"),
        ('[{"conversations": [\n  {"from": "human", "value": "x"},\n]}]', r"invalid JSON at line 3 column 1"),
        ('[{"conversations": []}]', r"no usable prompts in the file"),
        ("", r"the file is empty"),
        ("hello", r"neither a JSON list \(ShareGPT\) nor JSON lines"),
    ],
)
@pytest.mark.fast
def test_malformed_sharegpt_names_the_record(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(DatasetError, match=re.escape(str(p)) + ": " + message):
        load_dataset(p)


@pytest.mark.fast
def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(DatasetError, match="nope.json: no such file"):
        load_dataset(tmp_path / "nope.json")
    p = tmp_path / "latin1.jsonl"
    p.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1.jsonl: not UTF-8 text \(byte 15\)"):
        load_dataset(p)
    with pytest.raises(ValueError, match="format='csv'"):
        load_dataset(p, format="csv")


def test_the_server_counts_what_the_pool_says(sharegpt, jsonl):
    """Dataset prompts through the emulator: usage.prompt_tokens equals each prompt's `tokens`, nonce included."""
    import urllib.request

    from servesweep.sim.launch import start_sim

    def post(url: str, body: bytes) -> dict:
        req = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    with start_sim(["--model-path", "Qwen/Qwen3.6-27B"]) as sim:
        for pool in (load_dataset(sharegpt, n=4, seed=5), load_dataset(jsonl, n=4, seed=5)):
            nonces = pool.nonces()
            for p in pool:
                body = p.body("m", 1, next(nonces), extra={"stream": False})
                assert post(sim.base_url + "/v1/chat/completions", body)["usage"]["prompt_tokens"] == p.tokens
        only = jsonl.with_name("only.jsonl")
        only.write_text("\n".join(jsonl.read_text().splitlines()[:-1]) + "\n")
        pool = load_dataset(only, n=4, seed=5, endpoint="completions")
        nonces = pool.nonces()
        for p in pool:
            body = p.body("m", 1, next(nonces), extra={"stream": False})
            assert post(sim.base_url + "/v1/completions", body)["usage"]["prompt_tokens"] == p.tokens
