"""The after-stream parser and the status classifier, on SGLang's exact stream bytes (reference sglang.md §3-4)."""

from __future__ import annotations

import pytest

from servesweep.client.sse import classify_status, parse_stream

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

ROLE = b'data: {"id":"5f3c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":null,"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n'
REASON = b'data: {"id":"5f3c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n'
CONTENT = b'data: {"id":"5f3c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":null,"content":"Hello"},"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n'
FINISH = b'data: {"id":"5f3c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":null},"logprobs":null,"finish_reason":"length","matched_stop":null}]}\n'
USAGE = b'data: {"id":"5f3c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":30012,"total_tokens":30268,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":29952},"reasoning_tokens":7,"completion_tokens_details":null}}\n'
DONE = b"data: [DONE]\n"
BLANK = b"\n"
ERROR = b'data: {"error": {"object": "error", "message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}\n'


def run(lines):
    rec: dict = {}
    parse_stream(lines, list(range(100, 100 + len(lines))), rec)
    return rec


def test_full_sglang_stream():
    lines = [ROLE, BLANK, REASON, BLANK, CONTENT, BLANK, FINISH, BLANK, USAGE, BLANK, DONE, BLANK]
    r = run(lines)
    assert r.get("error_class") is None
    assert r["chunk_ns"] == [102, 104]  # reasoning and content chunks only; role/finish/usage carry no token
    assert r["first_token_ns"] == 102
    assert r["finish_reason"] == "length"
    assert (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"], r["reasoning_tokens"]) == (
        30012,
        256,
        29952,
        7,
    )
    assert r["chunk_tokens"] is None  # no per-chunk usage in this stream


def test_continuous_usage_gives_tokens_per_chunk():
    c1 = b'data: {"choices":[{"index":0,"delta":{"content":"a b"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n'
    c2 = b'data: {"choices":[{"index":0,"delta":{"content":"c d e"}}],"usage":{"prompt_tokens":5,"completion_tokens":5}}\n'
    r = run([c1, BLANK, c2, BLANK, USAGE, DONE])
    assert r["chunk_tokens"] == [2, 3]


def test_completions_text_chunks():
    t = b'data: {"choices":[{"index":0,"text":"Hi","logprobs":null,"finish_reason":null}]}\n'
    r = run([t, t, DONE])
    assert len(r["chunk_ns"]) == 2 and r.get("error_class") is None


@pytest.mark.parametrize(
    "lines, cls",
    [
        ([ROLE, CONTENT, ERROR, DONE], "stream_error_event"),
        ([ROLE, CONTENT, b'data: {"choices":[{"delta":{"content":"x"\n', CONTENT, DONE], "malformed_chunk"),
        ([ROLE, CONTENT, FINISH], "no_done"),
        ([ROLE, FINISH, USAGE, DONE], "no_tokens"),
        ([ROLE, CONTENT, FINISH.replace(b'"length"', b'"abort"'), DONE], "stream_error_event"),
    ],
)
def test_stream_failures_are_classified(lines, cls):
    r = run(lines)
    assert r["error_class"] == cls
    assert r["error_message"]


def test_error_event_message_is_kept():
    assert run([ROLE, ERROR, DONE])["error_message"] == "The request queue is full."


@pytest.mark.parametrize(
    "status, msg, cls",
    [
        (
            400,
            "The input (131073 tokens) is longer than the model's context length (131072 tokens).",
            "http_400_context",
        ),
        (
            400,
            "Requested token count exceeds the model's maximum context length of 4096 tokens.",
            "http_400_context",
        ),
        (400, "Input length (9 tokens) exceeds the maximum allowed length (8 tokens).", "http_400_context"),
        (400, "bad json", "http_4xx"),
        (401, "Unauthorized", "http_4xx"),
        (429, "Too Many Requests", "http_429"),
        (500, "Internal server error", "http_5xx"),
        (503, "The request queue is full.", "http_5xx"),
    ],
)
def test_status_classes(status, msg, cls):
    assert classify_status(status, msg) == cls


def test_reasoning_and_answer_times():
    r = run([ROLE, REASON, CONTENT, FINISH, USAGE, DONE])
    assert (r["first_reasoning_ns"], r["first_answer_ns"]) == (101, 102)
    r = run([ROLE, CONTENT, FINISH, USAGE, DONE])
    assert r["first_reasoning_ns"] is None and r["first_answer_ns"] == 101


def test_complete_stream_without_done_is_a_success():
    """transformers serve ends a complete stream with a finish reason and usage but no [DONE]."""
    r = run([ROLE, CONTENT, FINISH, USAGE])
    assert r.get("error_class") is None, r.get("error_message")
    assert r["completion_tokens"] == 256 and r["finish_reason"] == "length"


def test_cut_stream_without_done_is_no_done():
    for lines in ([ROLE, CONTENT], [ROLE, CONTENT, FINISH], [ROLE, CONTENT, USAGE]):
        r = run(lines)
        assert r["error_class"] == "no_done", lines


GEN = b'data: {"text":"%s","output_ids":[1],"meta_info":{"id":"x","finish_reason":%s,"prompt_tokens":40,"completion_tokens":%d,"cached_tokens":8}}\n'


def test_native_generate_stream():
    lines = [
        GEN % (b"a", b"null", 1),
        GEN % (b"ab", b"null", 2),
        GEN % (b"abc", b'{"type":"length","length":3}', 3),
    ]
    r = run([*lines, DONE])
    assert r.get("error_class") is None, r.get("error_message")
    assert r["chunk_ns"] == [100, 101, 102] and r["chunk_tokens"] == [1, 1, 1]
    assert (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]) == (40, 3, 8)
    assert r["finish_reason"] == "length"
    abort = run([GEN % (b"a", b'{"type":"abort","message":"x"}', 1), DONE])
    assert abort["error_class"] == "stream_error_event"


def test_lines_cut_after_the_stream_carry_the_stamp_of_the_read_that_completed_them():
    """The reader keeps (body length, stamp) per socket read and cuts lines after the stream: a line split across
    two reads gets the second read's stamp, lines that were whole in one read get that read's, and a half line at
    the end (a cut stream) is not a line."""
    from servesweep.client.sse import cut_lines

    body = bytearray(CONTENT + BLANK + CONTENT[:40])  # read 1: a whole event and the start of the next
    reached, stamps = [0, len(body)], [5, 10]
    body += CONTENT[40:] + BLANK  # read 2 completes it
    reached.append(len(body))
    stamps.append(20)
    body += USAGE[:30]  # read 3 brings half a line and nothing more (the stream was cut)
    reached.append(len(body))
    stamps.append(30)
    lines: list[bytes] = [ROLE]  # what the reader kept before the first token stays first
    times: list[int] = [1]
    cut_lines(body, reached, stamps, 99, lines, times)
    assert lines == [ROLE, CONTENT, BLANK, CONTENT, BLANK]
    assert times == [1, 10, 10, 20, 20]
    # bytes fed by a read whose stamp was not noted yet (an exception right after the feed) get `last`
    body += USAGE[30:]
    lines, times = [], []
    cut_lines(body, reached, stamps, 99, lines, times)
    assert times[-1] == 99 and lines[-1] == USAGE


def test_events_the_fast_decoder_refuses_parse_as_the_stdlib_does():
    """Integers past 64 bits and NaN are JSON the stdlib reads (orjson does not): the record must not change."""
    huge = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n'
    r = run([huge % 1, BLANK, huge % (2**70), BLANK, DONE, BLANK])
    assert r.get("error_class") is None
    assert r["chunk_ns"] == [100, 102]
    assert r["chunk_tokens"] is None  # a per-chunk count of 2**70 is nonsense: no per-chunk tokens
    assert r["completion_tokens"] is None  # not a plausible count (the last usage wins)
    nan = b'data: {"choices":[{"index":0,"delta":{"content":"y"}}],"score":NaN}\n'
    assert run([nan, BLANK, DONE, BLANK])["chunk_ns"] == [100]
