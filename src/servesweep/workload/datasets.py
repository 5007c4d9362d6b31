"""Prompts from local dataset files: ShareGPT JSON and JSONL, with length filters and seeded sampling.

    pool = load_dataset("sharegpt.json", n=500, min_prompt_tokens=100, max_prompt_tokens=4000, seed=1)

Formats:
- ShareGPT: a JSON list of `{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}, ...]}`. The prompt
  is the conversation up to its first human turn (system turns included); the next gpt turn's length becomes the
  prompt's `output_tokens` (a reference answer length). Conversations without a human turn are skipped.
- JSONL: one object per line, `{"prompt": "..."}` or `{"messages": [{"role", "content"}, ...]}`, optionally
  `"output_tokens": N`. Blank lines are ignored.

The result is a `PromptPool` like a synthetic one: the same `Prompt` objects with a nonce slot at the start of the
first user message (cache busting), token counts as the server counts them (nonce included), and `body_parts`.
A bad file raises `DatasetError` naming the file, the line (JSONL) or record index (JSON), and what is wrong.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from servesweep.workload.pool import (
    DEFAULT_NONCE_DIGITS,
    ENDPOINTS,
    NONCE_SLOT,
    Prompt,
    PromptPool,
    check_int,
    count_prompts,
    format_nonce,
    nonce_scheme,
)
from servesweep.workload.tokenizer import encode_batch, load_tokenizer

FORMATS = ("sharegpt", "jsonl")
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
_CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file, where, and what is wrong."""


# A parsed record before token counting: chat messages or raw text, a reference output (text or token count),
# and where it is in the file (for error messages).
_Record = tuple[list[dict] | None, str | None, str | int | None, str]


def _type_name(v: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _detect_format(path: Path, text: str) -> str:
    if path.suffix.lower() == ".jsonl":
        return "jsonl"
    first = text.lstrip()[:1]
    if first == "[":
        return "sharegpt"
    if first == "{":
        return "jsonl"
    if not first:
        raise DatasetError(f"{path}: the file is empty")
    raise DatasetError(f"{path}: neither a JSON list (ShareGPT) nor JSON lines (starts with {first!r})")


def _parse_sharegpt(path: Path, text: str) -> list[_Record]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a ShareGPT file is a JSON list of records, found a {_type_name(data)}")
    out: list[_Record] = []
    for i, rec in enumerate(data):
        where = f"{path}: record {i}"
        if not isinstance(rec, dict):
            raise DatasetError(f"{where}: expected an object, found a {_type_name(rec)}")
        conv = rec.get("conversations")
        if conv is None:
            raise DatasetError(f"{where}: missing field 'conversations'")
        if not isinstance(conv, list):
            raise DatasetError(f"{where}: 'conversations' must be a list, found a {_type_name(conv)}")
        msgs: list[dict] = []
        reference = None
        for j, turn in enumerate(conv):
            at = f"{where}: conversations[{j}]"
            if not isinstance(turn, dict):
                raise DatasetError(f"{at}: expected an object, found a {_type_name(turn)}")
            for k in ("from", "value"):
                if k not in turn:
                    raise DatasetError(f"{at}: missing field '{k}'")
                if not isinstance(turn[k], str):
                    raise DatasetError(f"{at}: '{k}' must be a string, found a {_type_name(turn[k])}")
            role = _SHAREGPT_ROLES.get(turn["from"].lower())
            if role is None:
                raise DatasetError(
                    f"{at}: unknown speaker 'from': {turn['from']!r} (expected human, gpt or system)"
                )
            if any(m["role"] == "user" for m in msgs):  # the prompt ends at the first human turn
                if role == "assistant" and reference is None:
                    reference = turn["value"]
                continue
            if role != "assistant":  # system turns and the first human turn; a leading gpt turn is dropped
                msgs.append({"role": role, "content": turn["value"]})
        if any(m["role"] == "user" for m in msgs):
            out.append((msgs, None, reference, where))
    return out


def _parse_jsonl(path: Path, text: str) -> list[_Record]:
    out: list[_Record] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: invalid JSON at column {e.colno}: {e.msg}") from None
        if not isinstance(rec, dict):
            raise DatasetError(f"{where}: expected a JSON object, found a {_type_name(rec)}")
        ref = rec.get("output_tokens")
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, int) or ref < 1):
            raise DatasetError(f"{where}: 'output_tokens' must be a positive integer, found {ref!r}")
        if "prompt" in rec:
            if not isinstance(rec["prompt"], str):
                raise DatasetError(f"{where}: 'prompt' must be a string, found a {_type_name(rec['prompt'])}")
            out.append((None, rec["prompt"], ref, where))
        elif "messages" in rec:
            msgs = rec["messages"]
            if not isinstance(msgs, list) or not msgs:
                raise DatasetError(f"{where}: 'messages' must be a non-empty list, found {_type_name(msgs)}")
            for j, m in enumerate(msgs):
                at = f"{where}: messages[{j}]"
                if not isinstance(m, dict):
                    raise DatasetError(f"{at}: expected an object, found a {_type_name(m)}")
                if "role" not in m or "content" not in m:
                    raise DatasetError(f"{at}: missing field '{'role' if 'role' not in m else 'content'}'")
                if m["role"] not in _CHAT_ROLES:
                    raise DatasetError(
                        f"{at}: unknown role {m['role']!r} (expected one of {', '.join(_CHAT_ROLES)})"
                    )
                if not isinstance(m["content"], str):
                    raise DatasetError(
                        f"{at}: 'content' must be a string, found a {_type_name(m['content'])}"
                    )
            if not any(m["role"] == "user" for m in msgs):
                raise DatasetError(f"{where}: 'messages' has no user message")
            out.append(([{"role": m["role"], "content": m["content"]} for m in msgs], None, ref, where))
        else:
            raise DatasetError(f"{where}: needs a 'prompt' (string) or 'messages' (list) field")
    return out


def load_dataset(
    path: str | Path,
    *,
    n: int | None = None,
    seed: int = 0,
    min_prompt_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
    tokenizer: str | None = None,
    endpoint: str = "chat",
    cache_bust: bool = True,
    nonce_digits: int = DEFAULT_NONCE_DIGITS,
    template_overhead: int | None = None,
    format: str | None = None,
) -> PromptPool:
    """Prompts from a ShareGPT or JSONL file, filtered by prompt length and sampled.

    Lengths are counted as the server counts them (see `build_pool`), nonce included. `n` None keeps every prompt
    that passes the filters, in file order; otherwise `n` of them drawn with `seed` (an error when fewer pass).
    """
    path = Path(path)
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
    if format is not None and format not in FORMATS:
        raise ValueError(f"format={format!r}: expected one of {', '.join(FORMATS)}")
    if n is not None:
        check_int("n", n, 1)
    check_int("seed", seed, 0)
    check_int("nonce_digits", nonce_digits, 1)
    lo, hi = _length_range(min_prompt_tokens, max_prompt_tokens)
    records = _read_records(path, format)

    tok = load_tokenizer(tokenizer)
    k = nonce_digits if cache_bust else 0
    nonce_fmt, k_tokens = nonce_scheme(tok, k)
    nonce = format_nonce("0" * k, nonce_fmt)
    if endpoint == "completions":  # raw text only: name the first record that is chat messages
        bad = next((r[3] for r in records if r[0] is not None), None)
        if bad is not None:
            raise DatasetError(f"{bad}: chat messages need endpoint 'chat', not 'completions'")

    def make(i: int) -> Prompt:
        return _make_prompt(records[i], endpoint, k, nonce_fmt)

    order = list(range(len(records)))
    if n is not None:
        random.Random(seed).shuffle(order)
    chosen = _choose(order, make, lambda ps: count_prompts(tok, ps, template_overhead, nonce), n, lo, hi)
    if not chosen or (n is not None and len(chosen) < n):
        span = f"{lo}..{'' if hi == float('inf') else hi}"
        raise DatasetError(
            f"{path}: {len(chosen)} of {len(records)} prompts are {span} tokens long"
            + (f", fewer than n={n}" if n is not None else "")
        )
    refs = [(p, records[i][2]) for i, p in chosen if isinstance(records[i][2], str)]
    for (p, _), ids in zip(refs, encode_batch(tok, [str(r) for _, r in refs]), strict=True):
        p.output_tokens = len(ids) or None
    return PromptPool(
        prompts=[p for _, p in chosen],
        endpoint=endpoint,
        tokenizer=tok.name,
        nonce_digits=k,
        nonce_tokens=k_tokens,
        nonce_format=nonce_fmt,
        prompt_tokens=None,
        template_overhead=template_overhead,
        seed=seed,
        source=f"dataset:{path}",
        counted_in_full=len(chosen),
    )


def _length_range(min_prompt_tokens: int | None, max_prompt_tokens: int | None) -> tuple[int, float]:
    """The prompt length filter as (lo, hi), hi infinite when not given."""
    for name, v in (("min_prompt_tokens", min_prompt_tokens), ("max_prompt_tokens", max_prompt_tokens)):
        if v is not None:
            check_int(name, v, 0)
    lo = min_prompt_tokens or 0
    hi = max_prompt_tokens if max_prompt_tokens is not None else float("inf")
    if lo > hi:
        raise ValueError(f"min_prompt_tokens={lo} is above max_prompt_tokens={hi}")
    return lo, hi


def _read_records(path: Path, format: str | None) -> list[_Record]:
    """The file's records, in the given format or the one its name and first character show."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start})") from None
    fmt = format or _detect_format(path, text)
    records = _parse_sharegpt(path, text) if fmt == "sharegpt" else _parse_jsonl(path, text)
    if not records:
        raise DatasetError(f"{path}: no usable prompts in the file")
    return records


def _make_prompt(record: _Record, endpoint: str, k: int, nonce_fmt: str) -> Prompt:
    """A record as a prompt for `endpoint`, the nonce slot first in its first user message (or its text); `tokens`
    is set once counted. A stray slot character in the record's text is dropped."""
    msgs, txt, ref, _ = record
    slot = NONCE_SLOT + "\n" if k else ""
    out_tokens = ref if isinstance(ref, int) else None  # a reference text is counted once chosen
    if endpoint == "chat":
        if msgs is None:
            msgs = [{"role": "user", "content": txt or ""}]
        msgs = [{**m, "content": m["content"].replace(NONCE_SLOT, "")} for m in msgs]
        u = next(j for j, m in enumerate(msgs) if m["role"] == "user")
        msgs[u] = {**msgs[u], "content": slot + msgs[u]["content"]}
        return Prompt(
            "chat", 0, messages=msgs, output_tokens=out_tokens, nonce_digits=k, nonce_format=nonce_fmt
        )
    text = slot + (txt or "").replace(NONCE_SLOT, "")
    return Prompt("completions", 0, text=text, output_tokens=out_tokens, nonce_digits=k, nonce_format=nonce_fmt)


def _choose(
    order: list[int],
    make: Callable[[int], Prompt],
    count: Callable[[list[Prompt]], list[int]],
    n: int | None,
    lo: int,
    hi: float,
) -> list[tuple[int, Prompt]]:
    """(record index, prompt) of the records in `order` whose length is within lo..hi: all of them (`n` None), or
    the first `n`, counting only batches of as many as needed."""
    chosen: list[tuple[int, Prompt]] = []
    batch = len(order) if n is None else max(64, 2 * n)
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        prompts = [make(i) for i in idx]
        for i, p, c in zip(idx, prompts, count(prompts), strict=True):
            if lo <= c <= hi:
                p.tokens = c
                chosen.append((i, p))
        if n is not None and len(chosen) >= n:
            return chosen[:n]
    return chosen
