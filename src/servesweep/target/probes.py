"""Probes of the server under test: small requests that fill in what a load point leaves to the server (model name,
chat-template overhead, per-chunk usage support) and read its counters. Each probe ends the way a normal request
ends (a stream is read to its end), so the server's own abort counters see none. Blocking stdlib HTTP: runs in the
parent and, monkey-patched, inside a Locust process started by hand.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from servesweep.config.point import LoadPoint
from servesweep.config.secrets import api_key_for
from servesweep.workload.build import request_extra


def request(point: LoadPoint, path: str, body: dict | None = None, timeout: float = 30.0):
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    headers.update(point.headers)
    key = api_key_for(point)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        point.base_url + path, data=data, headers=headers, method="POST" if data else "GET"
    )
    return urllib.request.urlopen(req, timeout=timeout)


_TRANSIENT = re.compile(r"HTTP (429|5\d\d)|cannot reach|timed out|Connection (reset|refused)", re.I)
PROBE_ATTEMPTS = 4  # 0.5 + 1 + 2 s of back-off: a server that sheds a request now and then still gets probed


class _Transient(RuntimeError):
    """A probe failure worth another try whatever its message says (an in-stream error event)."""


class ProbeLog:
    """What the probes of a point did: requests sent per probe (each attempt is one request) and notes for the
    summary (a model name the server does not list)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.notes: list[str] = []

    def count(self, kind: str) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + 1

    def as_dict(self) -> dict:
        return {"requests": dict(self.requests), "total": sum(self.requests.values())}


def _retrying(what: str, fn: Callable[[], object], log: ProbeLog | None = None, kind: str | None = None):
    """Run a probe, retrying what looks transient (429, 5xx, a refused or reset connection, a timeout)."""
    delay = 0.5
    for attempt in range(1, PROBE_ATTEMPTS + 1):
        try:
            if log is not None and kind:
                log.count(kind)
            return fn()
        except (RuntimeError, OSError) as e:
            transient = isinstance(e, _Transient) or _TRANSIENT.search(str(e))
            if attempt == PROBE_ATTEMPTS or not transient:
                raise RuntimeError(f"{what} (attempt {attempt} of {PROBE_ATTEMPTS}): {e}") from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def list_models(point: LoadPoint, log: ProbeLog | None = None) -> list[str]:
    """The model ids the server lists at GET /v1/models."""

    def once() -> dict:
        try:
            with request(point, "/v1/models", timeout=point.connect_s + 20) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"{point.base_url}/v1/models answered HTTP {e.code}: {e.read()[:200]!r}"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"{point.base_url}/v1/models: cannot reach the server ({e})") from None

    d = _retrying("listing models", once, log, "models")
    models = d.get("data") or [] if isinstance(d, dict) else []
    return [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]


def fetch_model(point: LoadPoint, log: ProbeLog | None = None) -> str:
    """The first model the server lists at GET /v1/models."""
    ids = list_models(point, log)
    if not ids:
        raise RuntimeError(f"{point.base_url}/v1/models lists no model; give --model")
    return ids[0]


def check_model(point: LoadPoint, log: ProbeLog) -> None:
    """A model name the server does not list gets a note (a warning, not an error: some servers serve any name,
    or list nothing); a server whose list cannot be read is left alone."""
    try:
        ids = list_models(point, log)
    except RuntimeError:
        return
    if ids and point.model not in ids:
        log.notes.append(
            f"model {point.model!r} is not among the models {point.base_url}/v1/models lists "
            f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}); the server may reject or re-route it"
        )


def probe_continuous_usage(point: LoadPoint, log: ProbeLog | None = None) -> bool:
    """Whether the server adds per-chunk usage with stream_options.continuous_usage_stats (SGLang, vLLM do).
    A server that rejects the option (4xx) does not; 429/5xx and connection errors are retried. The stream is read
    to its end (2 tokens), so the request ends as a normal one does: closing it early would count as an abort in
    the server's own metrics (SGLang's num_aborted_requests_total)."""
    body = {
        "model": point.model,
        "stream": True,
        "max_tokens": 2,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if point.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Say hi."}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Say hi."
        path = "/v1/completions"

    def once() -> bool:
        found = False
        try:
            with request(point, path, body, timeout=point.first_token_s) as r:
                for raw in r:
                    line = raw.strip()
                    if line.startswith(b"data:") and line[5:].strip() == b"[DONE]":
                        break
                    if not line.startswith(b"data:"):
                        continue
                    try:
                        ev = json.loads(line[5:])
                    except ValueError:
                        continue
                    if not isinstance(ev, dict):
                        continue
                    if "error" in ev:  # an in-stream error (an overloaded server): try again
                        raise _Transient(f"per-chunk usage probe: in-stream error {ev['error']}")
                    for ch in ev.get("choices") or ():
                        d = ch.get("delta") or {}
                        if (d.get("content") or d.get("reasoning_content") or ch.get("text")) and ev.get(
                            "usage"
                        ):
                            found = True  # read on to the end: an early close is an abort to the server
                r.read()  # whatever follows [DONE] (nothing, on a well-behaved server)
        except urllib.error.HTTPError as e:
            if e.code == 429 or e.code >= 500:
                raise RuntimeError(f"per-chunk usage probe: POST {path} answered HTTP {e.code}") from None
            return False  # the option itself was refused
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"per-chunk usage probe: cannot reach {point.base_url} ({e})") from None
        return found

    return bool(_retrying("probing per-chunk usage", once, log, "continuous_usage"))


def resolve_point(point: LoadPoint, log: ProbeLog | None = None) -> LoadPoint:
    """Fill what the point leaves to the server: model name, chat template overhead, continuous usage support.
    Each probe is one small request, retried when the failure looks transient; `log` counts them (and notes a
    model name the server does not list)."""
    upd: dict = {}
    log = log if log is not None else ProbeLog()
    if not point.probe:
        return (
            point
            if point.continuous_usage is not None
            else point.model_copy(update={"continuous_usage": False})
        )
    if point.model is None:
        upd["model"] = fetch_model(point, log)
        point = point.model_copy(update=upd)
    elif (
        point.template_overhead is None or point.continuous_usage is None
    ):  # not resolved before: check it once
        check_model(point, log)
    if point.template_overhead is None and point.endpoint == "chat":
        tpl_extra = {k: v for k, v in request_extra(point).items() if k == "chat_template_kwargs"}
        from servesweep.workload.prompts import probe_template_overhead

        upd["template_overhead"] = int(
            _retrying(
                "probing the chat template overhead",
                lambda: probe_template_overhead(
                    point.base_url,
                    point.model,
                    api_key=api_key_for(point),
                    endpoint="chat",
                    tokenizer=point.tokenizer,
                    extra={**point.extra_body, **tpl_extra} or None,
                ),
                log,
                "template_overhead",
            )
        )
    if point.continuous_usage is None and point.endpoint == "generate":
        upd["continuous_usage"] = False  # /generate says its counts in every event's meta_info anyway
    elif point.continuous_usage is None:
        upd["continuous_usage"] = probe_continuous_usage(point.model_copy(update=upd), log)
    return point.model_copy(update=upd) if upd else point


_CACHED_TOTAL = re.compile(r"^sglang:cached_tokens_total(?:\{[^}]*\})? (\S+)$", re.M)


def server_cached_tokens(point: LoadPoint) -> float | None:
    """SGLang's `sglang:cached_tokens_total` (summed over label sets) from GET /metrics; None when not exposed."""
    try:
        with request(point, "/metrics", timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    got = [float(m[1]) for m in _CACHED_TOTAL.finditer(text)]
    return sum(got) if got else None


