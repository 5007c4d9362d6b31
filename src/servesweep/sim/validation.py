"""The message of a request SGLang's HTTP layer rejects before its handler runs (FastAPI validation).

SGLang's `validation_exception_handler` (`entrypoints/http_server.py`) answers 400 `{"object":"error","message":
f"{exc} {exc.errors()}","type":"Bad Request",...}`. `str(exc)` is FastAPI's `ValidationException.__str__`:
`"<n> validation error(s):\\n"`, one `"  <error dict>\\n"` per error, then, for errors of the route's parameters,
the route's source location (`File "<http_server.py>", line <def line>, in <function>` and `POST <path>`), the
whole right-stripped. An error raised by SGLang's own `validate_json_request` dependency (the content type) has no
location. The file is where SGLang's Docker image installs it; the lines are those of each version's source.
"""

from __future__ import annotations

SOURCE = "/sgl-workspace/sglang/python/sglang/srt/entrypoints/http_server.py"

# (function, line) of SGLang's OpenAI routes, per version (entrypoints/http_server.py): the line of the route's
# first decorator (`@app.post(...)`), which is where Python starts a decorated function's code and so what FastAPI
# prints (checked against the running 0.5.23 server: tests/sglang_cpu/test_vs_emulator.py)
ROUTES = {
    (0, 5, 11): {
        "/v1/completions": ("openai_v1_completions", 1482),
        "/v1/chat/completions": ("openai_v1_chat_completions", 1490),
    },
    (0, 5, 23): {
        "/v1/completions": ("openai_v1_completions", 1860),
        "/v1/chat/completions": ("openai_v1_chat_completions", 1870),
    },
}


def _route(version: tuple[int, ...], path: str) -> tuple[str, int] | None:
    known = [v for v in ROUTES if v <= version]
    return ROUTES[max(known)].get(path) if known else None


def message(errors: list[dict], path: str | None, version: tuple[int, ...]) -> str:
    """`f"{exc} {exc.errors()}"` for these errors; `path` None for the content-type dependency's error."""
    n = len(errors)
    text = f"{n} validation error{'s' if n != 1 else ''}:\n" + "".join(f"  {e}\n" for e in errors)
    where = _route(version, path) if path else None
    if where is not None:
        text += f'\n  File "{SOURCE}", line {where[1]}, in {where[0]}\n    POST {path}'
    return f"{text.rstrip()} {errors}"


def chat_input(body: dict) -> dict:
    """The request dict as SGLang's ChatCompletionRequest validators hand it on (the error's `input`): its
    `mode="before"` validator `set_tool_choice_default` sets an unset `tool_choice` to "none" without tools,
    else "auto"."""
    out = dict(body)
    if out.get("tool_choice") is None:
        out["tool_choice"] = "none" if out.get("tools") is None else "auto"
    return out
