"""What the emulator answers: a coherent reply that states the prompt's needle, and the faulty replies.

servesweep's long prompts hide the fact " The access code for the {adjective} {noun} is {word}-{NNNN}." and end
with "Question: What is the access code for the {adjective} {noun}? Answer with the code only." A healthy answer
starts with the code, restates it in a sentence, then goes on in varied prose (sentences drawn from a small
grammar) for as many words as the request generates, so it is never degenerate however long. A prompt without a
needle (short prompts, datasets) gets the prose alone.

The text is a list of pieces, one per emitted token, each a word with its leading space (the code "falcon-4812."
is one piece), plain ASCII without quotes, backslashes or control characters, so the pieces go into a JSON string
unescaped, like text.py's words. The pieces are a pure function of (seed, prompt, fault, prompt_tokens,
speculative): the emulator answers greedily, and `answer_words(n)` is a prefix of `answer_words(n + k)`, so the
answer does not depend on max_tokens or on when the request was sent.

Answer faults (the same KIND[:ARG] grammar as faults.py, for `X-Sim-Fault` and `--sim-fault-rate`):
- `loop[:N]`: after N healthy pieces (default 0) the answer repeats one token: " lambda lambda lambda …", what
  Qwen3.6-27B streamed on an SGLang version that mishandled its hybrid attention.
- `wrong_past:T`: when the prompt is longer than T tokens, the answer states a wrong code (a fluent, confident,
  wrong answer: what a wrong context-length or RoPE setting gives); shorter prompts are answered correctly.
- `spec_diverge[:N]`: with speculative decoding on, the answer leaves the autoregressive one after N pieces
  (default 8): from there its prose is drawn from another stream, so greedy answers of the speculative and the
  autoregressive server differ; with it off the answer is the healthy one. N = 0 changes the code itself.

This module imports nothing of the load generator (sim/ rule); results/answer_checks.py holds the checks that read
these answers, and the tests run one against the other.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from servesweep.sim.faults import ANSWER_KINDS, Fault, parse_fault

LOOP_TOKEN = " lambda"

# The needle as workload/prompts.py `_needle` writes it; matched on the prompt text (chat content or raw text).
_QUESTION = re.compile(r"Question: What is the access code for the ([a-z]+) ([a-z]+)\?")
_FACT = " The access code for the {} {} is "
_CODE = re.compile(r"([a-z]+)-(\d+)\.", re.ASCII)  # ASCII digits: pieces are ASCII, offsets count bytes
_CODE_WORDS = (
    "falcon juniper lantern meadow orchid pebble quartz river sparrow thistle walnut willow".split()
)  # filler.json's needle words: a wrong code looks like a right one

# A small grammar for the prose after the answer: enough combinations (≈ 3·10^6 sentences) that 2,000 words of it
# repeat no sentence and no phrase often enough to look degenerate (tests/sim/test_sim_answers.py checks).
_OPENERS = (
    "|||In short,|Note that|For context,|As a result,|In practice,|By contrast,|Put simply,|"
    "On the other hand,|To be precise,|Meanwhile,|In the same passage,"
).split("|")
_SUBJECTS = (
    "the document|the long passage|the paragraph about the harbor|the text|the opening section|"
    "the final paragraph|each section|the surrounding material|the question|the middle of the text|"
    "the list of facts|the description of the archive|the narrative|a later sentence|the reader|"
    "the summary|the account of the workshop|the second half|the earlier remark|the closing line"
).split("|")
_VERBS = (
    "mentions|describes|repeats|never contradicts|supports|qualifies|introduces|lists|refers back to|"
    "explains|emphasizes|separates|connects|contrasts|quietly assumes|returns to|summarizes|frames|"
    "clarifies|leaves out"
).split("|")
_OBJECTS = (
    "the history of the building|several unrelated details|the weather on the coast|"
    "a schedule of visits|the names of the keepers|a few numbers|the age of the collection|"
    "how the rooms are arranged|the cost of repairs|the route along the river|an old disagreement|"
    "the rules for visitors|the purpose of each room|a change of ownership|the seasons of the year|"
    "the tools in the shed|a quiet afternoon|the view from the tower|the nearby villages|"
    "the wording of the question|a record of deliveries|the only code it gives|"
    "the materials of the roof|a short anecdote|the order of events"
).split("|")
_TAILS = (
    "||||without much emphasis|in passing|in some detail|for the second time|with a precise date|"
    "before moving on|as background|near the end|in a single clause|with a small example|"
    "more carefully than the rest|to set the scene|in plain language|as a reminder|"
    "with an explicit number|without any ambiguity"
).split("|")


@dataclass(frozen=True, slots=True)
class Needle:
    """The needle a prompt asks about: its subject ("amber archive") and its code ("falcon-4812")."""

    subject: str
    code: str


def parse_answer_fault(spec: str, where: str = "X-Sim-Fault") -> Fault:
    """`loop`, `loop:16`, `wrong_past:30000`, `spec_diverge:4` -> Fault; errors name `where` (as faults.py)."""
    kind = spec.strip().partition(":")[0].strip().lower()
    if kind not in ANSWER_KINDS:
        raise ValueError(f"{where}: unknown answer fault kind {kind!r} (known: {', '.join(ANSWER_KINDS)})")
    fault = parse_fault(spec, where)
    if fault.arg != int(fault.arg):
        raise ValueError(f"{where}: fault {kind!r} argument must be a whole number ≥ 0, got {fault.arg:g}")
    return fault


def find_needle(prompt: str) -> Needle | None:
    """The needle the prompt's closing question asks about, with the code its fact states; None when the prompt
    has no question, or no fact for the question's subject (a dataset prompt, a short prompt)."""
    found = list(_QUESTION.finditer(prompt))
    if not found:
        return None
    q = found[-1]  # the last question is the one to answer
    fact = _FACT.format(q[1], q[2])
    at = prompt.rfind(fact, 0, q.start())
    code = _CODE.match(prompt, at + len(fact)) if at >= 0 else None
    return Needle(f"{q[1]} {q[2]}", f"{code[1]}-{code[2]}") if code else None


def _stream(seed: int, prompt: str, salt: str) -> random.Random:
    """A generator fixed by (seed, prompt, salt): the prompt is hashed (a 100k-token prompt is 400 KB)."""
    digest = hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return random.Random(f"{seed}:{digest}:{salt}")


def _wrong_code(code: str, rng: random.Random) -> str:
    """A code of the same shape that is not `code`: another needle word and other digits."""
    word, _, digits = code.partition("-")
    other = rng.choice([w for w in _CODE_WORDS if w != word])
    n = int(digits) if digits.isdigit() else 0
    return f"{other}-{(n - 1000 + rng.randrange(1, 8999)) % 9000 + 1000}"


def _sentence(rng: random.Random) -> list[str]:
    """One sentence of the prose grammar, as pieces (" word")."""
    opener, subj, verb = rng.choice(_OPENERS), rng.choice(_SUBJECTS), rng.choice(_VERBS)
    obj, tail = rng.choice(_OBJECTS), rng.choice(_TAILS)
    words = " ".join(filter(None, (opener, subj, verb, obj, tail))).split()
    words[0] = words[0][0].upper() + words[0][1:]
    words[-1] += "."
    return [" " + w for w in words]


def _prose(rng: random.Random) -> Iterator[str]:
    while True:
        yield from _sentence(rng)


def _healthy(needle: Needle | None, code: str | None, rng: random.Random) -> Iterator[str]:
    """The answer's pieces: the code, a sentence restating it, then prose without end (the caller cuts it)."""
    if needle is not None and code is not None:
        yield " " + code
        yield from (" " + w for w in f"The access code for the {needle.subject} is {code}.".split())
    yield from _prose(rng)


def answer_words(
    prompt: str,
    n: int,
    *,
    seed: int = 0,
    fault: Fault | None = None,
    prompt_tokens: int | None = None,
    speculative: bool = False,
) -> list[str]:
    """The first `n` pieces (tokens) of the emulator's greedy answer to `prompt` (module docstring).

    `prompt_tokens` is the prompt's length as the server counted it (for `wrong_past`; estimated as chars / 4
    when not given). Faults of other kinds (faults.py's) leave the text healthy."""
    needle = find_needle(prompt)
    code = needle.code if needle else None
    kind = fault.kind if fault else None
    arg = int(fault.arg) if fault else 0
    if kind == "wrong_past" and code is not None:
        length = prompt_tokens if prompt_tokens is not None else len(prompt) // 4
        if length > arg:
            code = _wrong_code(code, _stream(seed, prompt, "wrong"))
    pieces = _healthy(needle, code, _stream(seed, prompt, "prose"))
    out: list[str] = []
    if kind == "spec_diverge" and speculative:
        for piece in pieces:  # the autoregressive answer up to the divergence point
            if len(out) >= min(arg, n):
                break
            out.append(piece)
        other = _stream(seed, prompt, "diverged")
        wrong = _wrong_code(code, other) if code and not out else code
        pieces = _healthy(needle, wrong, other) if not out else _prose(other)
    elif kind == "loop":
        for piece in pieces:
            if len(out) >= min(arg, n):
                break
            out.append(piece)
        return out + [LOOP_TOKEN] * (n - len(out))
    for piece in pieces:
        if len(out) >= n:
            break
        out.append(piece)
    return out


def answer_text(prompt: str, n: int, **kwargs) -> str:
    """`answer_words` joined, without the first piece's leading space: the answer as a client reads it."""
    return "".join(answer_words(prompt, n, **kwargs)).lstrip(" ")


def thinking_words(prompt: str, n: int, *, seed: int = 0, fault: Fault | None = None) -> list[str]:
    """The first `n` pieces of the emulator's reasoning before its answer: prose of its own stream (it never states
    the code, so an answer scored without its reasoning is judged on the answer alone); a `loop` fault loops here
    too, as a model that loops while thinking never reaches its answer."""
    if fault is not None and fault.kind == "loop":
        return [LOOP_TOKEN] * n
    rng = _stream(seed, prompt, "thinking")
    out: list[str] = []
    for piece in _prose(rng):
        if len(out) >= n:
            break
        out.append(piece)
    return out
