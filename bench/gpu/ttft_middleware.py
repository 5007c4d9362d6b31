"""A server-side record of every chat request: arrival, body received, each response chunk, for `transformers serve`.

An ASGI middleware wrapped around the server's app by patching `uvicorn.Config.load` (every way of starting uvicorn
goes through it), so the server's code is untouched:

    python3 -c "import sys; sys.path.insert(0, 'bench/gpu'); import ttft_middleware; ttft_middleware.install(); \
                from transformers.cli.transformers import app; app()" serve MODEL ...

One JSON line per request to $TTFT_MW_LOG (default /tmp/ttft_mw.jsonl), written when the response ends:
  i          order of arrival at the server (0, 1, ...)
  xrid       the X-Request-Id header (servesweep sends one), else null
  ua         the User-Agent header (tells the clients apart)
  peer       the client's (address, port): one port per TCP connection
  arr_ns     time.monotonic_ns() when the ASGI call began (the request line and headers were parsed)
  body_ns    when the last body byte was handed to the app
  start_ns   the response's http.response.start (status sent)
  chunks_ns  every non-empty http.response.body send, in order (the SSE events as the app yields them)
  content_ns the first chunk whose delta holds non-empty "content" (the server's first token)
  usage      prompt_tokens and completion_tokens of the chunk that carried usage
  status, keys (the body's top-level keys as sent), rewritten (keys changed by TTFT_MW_REWRITE), nbytes
CLOCK_MONOTONIC is the clock of Python's perf_counter and monotonic on Linux, so client stamps on the same machine
compare directly.

TTFT_MW_REWRITE=1 makes the body acceptable to transformers serve when a client sends fields it refuses (HTTP 422)
although they mean its default: `ignore_eos: false` is dropped and `max_completion_tokens` becomes `max_tokens`
(SGLang's bench_serving sends both, always). The record names every rewrite. Nothing else is changed. A request with
the header `X-MW-Raw: 1` is passed as sent (to see what the server itself answers).
"""

from __future__ import annotations

import json
import os
import threading
import time

_LOG = os.environ.get("TTFT_MW_LOG", "/tmp/ttft_mw.jsonl")
_REWRITE = os.environ.get("TTFT_MW_REWRITE", "") == "1"
_lock = threading.Lock()
_count = [0]


def _rewrite(body: bytes, allowed: bool = True) -> tuple[bytes, list[str], list[str]]:
    try:
        obj = json.loads(body)
    except ValueError:
        return body, [], []
    if not isinstance(obj, dict):
        return body, [], []
    keys = sorted(obj)
    changed = []
    if _REWRITE and allowed:
        if obj.get("ignore_eos") is False:
            del obj["ignore_eos"]
            changed.append("-ignore_eos")
        if "max_completion_tokens" in obj and "max_tokens" not in obj:
            obj["max_tokens"] = obj.pop("max_completion_tokens")
            changed.append("max_completion_tokens->max_tokens")
    if changed:
        body = json.dumps(obj).encode()
    return body, keys, changed


def _has_content(chunk: bytes) -> bool:
    i = chunk.find(b'"content":')
    if i < 0:
        return False
    rest = chunk[i + 10 : i + 12].lstrip()
    return not (rest.startswith(b'""') or rest.startswith(b"nu"))


def _usage(chunk: bytes):
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                u = json.loads(line[6:]).get("usage")
            except ValueError:
                continue
            if u:
                return {k: u.get(k) for k in ("prompt_tokens", "completion_tokens")}
    return None


class Recorder:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or not scope.get("path", "").endswith("/completions"):
            return await self.app(scope, receive, send)
        arr = time.monotonic_ns()
        with _lock:
            i = _count[0]
            _count[0] += 1
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        rec = {"i": i, "path": scope["path"], "xrid": headers.get("x-request-id"), "ua": headers.get("user-agent"),
               "peer": list(scope.get("client") or []), "arr_ns": arr, "body_ns": None, "start_ns": None,
               "status": None, "chunks_ns": [], "content_ns": None, "keys": None, "rewritten": [], "nbytes": 0}
        # Read the whole body first (the app reads it whole too), rewrite it if asked, then hand it over.
        parts = []
        while True:
            m = await receive()
            if m["type"] != "http.request":
                break
            parts.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        body = b"".join(parts)
        rec["nbytes"] = len(body)
        body, rec["keys"], rec["rewritten"] = _rewrite(body, headers.get("x-mw-raw") != "1")
        rec["body_ns"] = time.monotonic_ns()
        if rec["rewritten"]:
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"] + [
                (b"content-length", str(len(body)).encode())]
        delivered = [False]

        async def recv():
            if not delivered[0]:
                delivered[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def snd(m):
            t = time.monotonic_ns()
            if m["type"] == "http.response.start":
                rec["start_ns"], rec["status"] = t, m["status"]
            elif m["type"] == "http.response.body" and m.get("body"):
                rec["chunks_ns"].append(t)
                if rec["content_ns"] is None and _has_content(m["body"]):
                    rec["content_ns"] = t
                if b'"usage"' in m["body"]:
                    rec["usage"] = _usage(m["body"])
            await send(m)

        try:
            await self.app(scope, recv, snd)
        finally:
            rec["end_ns"] = time.monotonic_ns()
            with _lock, open(_LOG, "a") as f:
                f.write(json.dumps(rec) + "\n")


def install() -> None:
    """Wrap every app uvicorn loads from now on in `Recorder`."""
    import uvicorn.config

    orig = uvicorn.config.Config.load
    if getattr(orig, "_ttft_mw", False):
        return

    def load(self):
        orig(self)
        self.loaded_app = Recorder(self.loaded_app)

    load._ttft_mw = True
    uvicorn.config.Config.load = load
