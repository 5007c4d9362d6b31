"""A prompt pool written for the peers' benchmark clients, so that they can replay exactly servesweep's prompts.

Two formats, each the custom-dataset file its client reads (taken from their code, not their docs):

- ``sglang``: SGLang ``bench_serving --dataset-name custom --dataset-path FILE`` (sglang 0.5.23,
  ``sglang/benchmark/datasets/custom.py``, ``sample_custom_requests``). JSON Lines, one object per prompt:
  ``{"conversations": [{"from": "human", "value": PROMPT}, {"from": "gpt", "value": ANSWER}]}``. The first turn is
  the prompt (sent as the one user message by the chat backends, as ``prompt`` by the completions ones); the second
  turn only sizes the output when ``--sharegpt-output-len`` is not given (its token count; under 2 tokens the row is
  dropped), so give ``--sharegpt-output-len N``. Leave ``--apply-chat-template`` off for chat backends (the server
  applies it). The client shuffles the rows (``random.shuffle``, seeded by ``--seed``).
- ``vllm``: vLLM ``vllm bench serve --dataset-name custom --dataset-path FILE.jsonl`` (vllm-project/vllm
  ``vllm/benchmarks/datasets/custom.py``, ``CustomDataset.load_data``, commit 237145e; ``datasets.py`` before the
  split). JSON Lines (the name must end in ``.jsonl``) with a ``prompt`` column: ``{"prompt": PROMPT}``. Give
  ``--skip-chat-template`` with a chat backend (else the client renders the template itself and the server renders
  it again) and ``--custom-output-len N``; the client shuffles unless ``--disable-shuffle``.

What is written. Each prompt's text as servesweep would send it: a chat prompt's one user message, a completions
prompt's text, with its nonce slot filled. The nonces come from one counter (``nonce_start``, default 0) in the
pool's own format, so the prompts of a file differ from their first token on and keep exactly the pool's token
counts; a peer replaying the same file twice does hit the server's prefix cache (export again with another
``nonce_start``). Chat prompts with a system message (shared-prefix pools) have no place in either format: refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from servesweep.files import write_atomic
from servesweep.workload.pool import Nonces, Prompt, PromptPool

FORMATS = ("sglang", "vllm")

# The assistant turn of the SGLang file: it sizes the output only without --sharegpt-output-len.
SGLANG_ANSWER = "servesweep prompt pool: give --sharegpt-output-len N for the output length."


def prompt_texts(pool: PromptPool, nonce_start: int = 0) -> Iterator[str]:
    """Each prompt's text as the peers send it: chat: the user message; completions: the text; nonce filled in."""
    nonces = Nonces(pool.nonce_digits, nonce_start, spaced=pool.nonce_format == "spaced")
    for i, p in enumerate(pool):
        yield _text(p, i, next(nonces).decode())


def _text(p: Prompt, i: int, nonce: str) -> str:
    r = p.render(nonce if p.nonce_digits else "")
    if isinstance(r, str):
        return r
    if len(r) != 1 or r[0].get("role") != "user":
        roles = ", ".join(m.get("role", "?") for m in r)
        raise ValueError(
            f"prompt {i} has messages ({roles}): the peers' custom datasets hold one user message per prompt "
            "(a shared-prefix pool's system prompt cannot be carried; build the pool without it, or with "
            "--endpoint completions)"
        )
    return r[0]["content"]


def rows(pool: PromptPool, fmt: str, nonce_start: int = 0) -> Iterator[dict]:
    """The file's JSON objects, one per prompt, in pool order."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    for text in prompt_texts(pool, nonce_start):
        if fmt == "sglang":
            yield {
                "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": SGLANG_ANSWER}]
            }
        else:
            yield {"prompt": text}


def export_pool(pool: PromptPool, fmt: str, out: str | os.PathLike, nonce_start: int = 0) -> int:
    """Write `pool` to `out` in format `fmt` (``sglang`` or ``vllm``); how many prompts were written.

    Written to a temporary file beside `out` and renamed, so a reader never sees half a file.
    """
    out = Path(out)
    if fmt == "vllm" and out.suffix != ".jsonl":
        raise ValueError(f"{out}: vLLM's custom dataset reads only files named *.jsonl")
    lines = [json.dumps(r, ensure_ascii=False) for r in rows(pool, fmt, nonce_start)]
    write_atomic(out, "".join(line + "\n" for line in lines), mode=0o666)
    return len(lines)


def peer_hint(fmt: str, out: str | os.PathLike) -> str:
    """How the peer's client reads the file (printed by ``servesweep prompts --export``)."""
    if fmt == "sglang":
        return (
            f"python -m sglang.benchmark.serving --backend sglang-oai-chat --dataset-name custom "
            f"--dataset-path {out} --sharegpt-output-len N --num-prompts M ..."
        )
    return (
        f"vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --dataset-name custom "
        f"--dataset-path {out} --skip-chat-template --custom-output-len N --num-prompts M ..."
    )
