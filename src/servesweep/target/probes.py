"""Probes of the server under test: small requests that fill in what a load point leaves to the server (model name,
chat-template overhead, per-chunk usage support) and read its counters. Each probe ends the way a normal request
ends (a stream is read to its end), so the server's own abort counters see none. Requests go through
target/http.py: they run in the parent and, monkey-patched, inside a Locust process started by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from servesweep.config.point import LoadPoint
from servesweep.config.secrets import api_key_for
from servesweep.target import http
from servesweep.workload.build import request_extra
from servesweep.workload.prompts import template_probe
from servesweep.workload.tokenizer import tokenizer_source

T = TypeVar("T")


def _call(point: LoadPoint, timeout: float) -> dict:
    """What every request to the point's server carries: its API key, its extra headers, a timeout."""
    return {"api_key": api_key_for(point), "extra_headers": point.headers, "timeout": timeout}


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


def _retrying(what: str, fn: Callable[[], T], log: ProbeLog | None, kind: str) -> T:
    """A probe under the one retry policy (target/http.py), each request it sends counted in `log`."""
    return http.retrying(what, fn, http.PROBE, before_each=None if log is None else lambda: log.count(kind))


def list_models(point: LoadPoint, log: ProbeLog | None = None) -> list[str]:
    """The model ids the server lists at GET /v1/models."""

    def once() -> dict:
        return http.get_json(point.base_url + "/v1/models", **_call(point, point.connect_s + 20))

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
    body: dict[str, Any] = {
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
            for ev in http.stream_events(point.base_url + path, body, **_call(point, point.first_token_s)):
                for ch in ev.get("choices") or ():
                    d = ch.get("delta") or {}
                    if (d.get("content") or d.get("reasoning_content") or ch.get("text")) and ev.get("usage"):
                        found = True
        except http.ServerError as e:
            if e.transient or e.status is None:
                raise e.prefixed("per-chunk usage probe") from None
            return False  # the option itself was refused
        return found

    return bool(_retrying("probing per-chunk usage", once, log, "continuous_usage"))


def probe_template_overhead(
    base_url: str,
    model: str,
    api_key: str | None = None,
    endpoint: str = "chat",
    tokenizer: str | None = None,
    *,
    system: bool = False,
    extra: dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> int:
    """Tokens the server adds around the content: its `usage.prompt_tokens` minus the content's own tokens.

    Sends one small non-streaming request (workload/prompts.py `template_probe`), once: `resolve_point` retries it
    under the one policy. `extra` is merged into the request (e.g. `chat_template_kwargs`), so the probe sees the
    template the load will; `headers` go with it. completions: the result counts e.g. a BOS token.
    """
    path, body, content_tokens = template_probe(endpoint, model, tokenizer, system=system)
    body.update(extra or {})
    base = base_url.rstrip("/")
    url = (base if base.endswith("/v1") else base + "/v1") + path
    try:
        answer = http.post_json(url, body, api_key=api_key, extra_headers=headers, timeout=timeout)
    except http.ServerError as e:
        raise e.prefixed("template probe") from None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    pt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(pt, int):
        raise RuntimeError(f"template probe: POST {url} answered without usage.prompt_tokens")
    overhead = pt - content_tokens
    if overhead < 0:
        raise RuntimeError(
            f"template probe: the server counted {pt} prompt tokens for content of {content_tokens} tokens; "
            f"its tokenizer differs from {tokenizer_source(tokenizer)[0]} (pass the model's tokenizer)"
        )
    return overhead


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
    model = point.model
    assert model is not None  # given, or fetched above
    if point.template_overhead is None and point.endpoint == "chat":
        tpl_extra = {k: v for k, v in request_extra(point).items() if k == "chat_template_kwargs"}
        upd["template_overhead"] = int(
            _retrying(
                "probing the chat template overhead",
                lambda: probe_template_overhead(
                    point.base_url,
                    model,
                    api_key=api_key_for(point),
                    headers=point.headers,
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


def server_metrics_text(point: LoadPoint, timeout: float = 2.0) -> str:
    """GET the server's Prometheus /metrics once (the point's API key and headers, no retry: the driver's sampler
    asks again a second later). ServerError when no usable answer came."""
    return http.get_text(point.base_url + "/metrics", **_call(point, timeout))
