"""A response's text as the record keeps it: what the model answered (`content`, a completion's `text`) and what
it reasoned (`reasoning_content`) apart. Gathered by client/sse.py's parse after the stream has ended, never per
chunk; the checks that read the texts (results/answer_checks.py) run in the parent, not in Locust."""

from __future__ import annotations


def add_texts(ev: dict, content: list[str], reasoning: list[str]) -> None:
    """Append the answer and reasoning pieces of one OpenAI chunk (its fields' types already checked)."""
    for ch in ev.get("choices") or ():
        d = ch.get("delta")
        if d is not None:
            if d.get("content"):
                content.append(d["content"])
            if d.get("reasoning_content"):
                reasoning.append(d["reasoning_content"])
        elif ch.get("text"):
            content.append(ch["text"])


def set_texts(rec: dict, content: list[str], reasoning: list[str], generate_text: str | None) -> None:
    """The record's `response_text` (None when no token came) and `reasoning_text` (None without reasoning).
    A native /generate stream's text is cumulative: its last event's text is the answer."""
    if generate_text is not None:
        rec["response_text"] = generate_text
    else:
        rec["response_text"] = "".join(content) if content or reasoning else None
    rec["reasoning_text"] = "".join(reasoning) if reasoning else None
