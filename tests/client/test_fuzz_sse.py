"""Property tests of the load core's post-stream SSE parser (client/sse.py: parse_stream, is_token_line): any bytes a server
(or a proxy, or a broken network) sends give a record with an error class or a clean token timeline, never an
exception that would kill a Locust user's task."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesweep.client.sse import is_token_line, parse_stream
from servesweep.results.records import ERROR_CLASSES, to_table

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=8),
)
json_any = st.recursive(
    json_leaf,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=12,
)
# chunks shaped like OpenAI/SGLang events, with every field free to be the wrong type
choice = st.fixed_dictionaries(
    {},
    optional={
        "delta": st.one_of(
            json_any, st.fixed_dictionaries({}, optional={"content": json_any, "reasoning_content": json_any})
        ),
        "text": json_any,
        "finish_reason": json_any,
        "index": json_any,
    },
)
event = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.one_of(json_any, st.lists(st.one_of(choice, json_any), max_size=3)),
        "usage": st.one_of(
            json_any,
            st.fixed_dictionaries(
                {},
                optional={
                    "completion_tokens": json_any,
                    "prompt_tokens": json_any,
                    "prompt_tokens_details": json_any,
                    "completion_tokens_details": json_any,
                    "reasoning_tokens": json_any,
                },
            ),
        ),
        "error": json_any,
    },
)
line = st.one_of(
    event.map(lambda e: b"data: " + json.dumps(e).encode()),
    json_any.map(lambda v: b"data: " + json.dumps(v).encode()),
    st.binary(max_size=60),
    st.binary(max_size=60).map(lambda b: b"data:" + b),
    st.sampled_from([b"", b"data: [DONE]", b": keep-alive", b"event: error", b"data:", b"data: {"]),
)


def _parse(lines: list[bytes]) -> dict:
    # the fields the Locust user fills before the stream (user.py), so the record can go into the Parquet schema
    rec: dict = {
        "request_id": "r",
        "point_id": "p",
        "worker": "w",
        "user": 0,
        "warmup": False,
        "scheduled_ns": 0,
        "sent_ns": 0,
        "end_ns": len(lines) + 1,
        "target_prompt_tokens": 1,
        "target_output_tokens": 1,
        "mono_to_wall_ns": 0,
        "http_status": 200,
    }
    parse_stream(lines, list(range(1, len(lines) + 1)), rec)
    # whatever the server said, the record fits the documented schema: one bad row must not lose a whole point
    to_table([rec])
    return rec


@settings(max_examples=600, deadline=None)
@given(lines=st.lists(line, max_size=12))
def test_any_stream_gives_a_record_not_an_exception(lines):
    rec = _parse(lines)
    assert rec.get("error_class") is None or rec["error_class"] in ERROR_CLASSES
    # a stream counted healthy has a token timeline in time order
    if rec.get("error_class") is None:
        assert rec["chunk_ns"] and rec["chunk_ns"] == sorted(rec["chunk_ns"])
        assert rec["first_token_ns"] == rec["chunk_ns"][0]
    for ln in lines:
        assert is_token_line(ln) in (True, False)


@pytest.mark.fast
def test_a_good_stream_and_its_broken_variants():
    tok = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":%d}}'
    good = [tok % 1, tok % 3, b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}', b"data: [DONE]"]
    rec = _parse(good)
    assert rec.get("error_class") is None and rec["chunk_tokens"] == [1, 2] and rec["finish_reason"] == "stop"
    assert _parse(good[:-1])["error_class"] == "no_done"
    assert _parse([good[0], b"data: {broken", *good[1:]])["error_class"] == "malformed_chunk"
    assert (
        _parse([good[0], b'data: {"error": {"message": "boom"}}', *good[1:]])["error_class"]
        == "stream_error_event"
    )
