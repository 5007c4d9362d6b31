"""The decisive line of a server log that ends in a failed start: what to print before the log's tail.

SGLang rejecting its arguments prints its whole argparse usage text (hundreds of lines) and, last, one line
``sglang serve: error: unrecognized arguments: --gpu-memory-utilization 0.85``; a failure while loading prints a
Python traceback whose last line (``ValueError: ...``) says what went wrong. The tail of such a log is mostly usage
text or stack frames; `decisive_line` finds the line that matters. Plain text in, a line out: no SGLang needed, so
it serves a generic (vLLM, ...) server's log as well.
"""

from __future__ import annotations

import re

MAX_CHARS = 500  # a line longer than this is cut (a usage line can be long; the message's start is what counts)

# What the host puts before a line the server wrote: journald ("May 01 10:00:00 host python3[123]: "), a
# timestamp (docker logs -t, "2026-05-01T10:00:00.123456Z "). SGLang's own logger prefix ("[2026-05-01 10:00:00
# TP0] ") is not one: argparse and Python's traceback print write bare lines, so a logged line is never taken.
_PREFIX = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^:\s]+: |\d{4}-\d\d-\d\dT[\d:.]+Z?\s+)")
# argparse's parser.error(): "<prog>: error: <message>" (prog: 'sglang serve', 'launch_server.py', ...)
_ARGPARSE = re.compile(r"^(?:[\w./-]+(?: [\w./-]+){0,3}: )?error: \S")
# the last line of a traceback: "ValueError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt"
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::\s.*)?$")
_EXCEPTION_NAME = re.compile(r"(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout)$")


def _own_text(line: str) -> str:
    """The line without the logger's, journal's or container's prefix."""
    return _PREFIX.sub("", line, count=1)


def _cut(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1] + "…"


def _is_exception_line(text: str) -> bool:
    """'ValueError: ...', 'torch.OutOfMemoryError: ...', 'KeyboardInterrupt': a class name (CamelCase, or ending in
    Error, Exit, ...), dotted or not, then its message; not 'WARNING: ...' nor a frame (indented)."""
    if not text or text[0].isspace() or not _EXCEPTION.match(text):
        return False
    name = text.split(":", 1)[0].rsplit(".", 1)[-1]
    if _EXCEPTION_NAME.search(name):
        return True
    return ":" in text and name[0].isupper() and any(c.islower() for c in name)


def decisive_line(log: str) -> str | None:
    """The line that says why the server did not start: the last argparse error (`...: error: ...`), else the
    exception line of the last Python traceback, else None. The line as the log has it (its prefix kept)."""
    lines = log.splitlines()
    for line in reversed(lines):
        if _ARGPARSE.match(_own_text(line)):
            return _cut(line)
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if _is_exception_line(_own_text(line)):
            return _cut(line)
    return None
