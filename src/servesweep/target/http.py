"""The one way servesweep talks to a server over HTTP, outside the per-chunk path: JSON GET and POST, a stream read
to its end, the API key and extra headers, timeouts; and the one retry policy.

Transient, so worth another try: a connection that cannot be made or breaks, no answer within the timeout, HTTP 429
and 5xx, an error event inside a 200 stream (an overloaded server sheds a request that way). Anything else (another
4xx, an answer that is not JSON) is the server's answer and is not tried again. Back-off is exponential: the first
delay, doubled after each attempt, up to a cap (`Retry`). A server still starting is waited for by `wait_ready`
(poll until a deadline), not retried.

Blocking `requests`, retries by `tenacity`: runs in the parent and, monkey-patched by gevent, inside a Locust
process that probes the server itself. The per-chunk streaming path (client/user.py, geventhttpclient) does not
come here: it stamps every chunk and never retries. Two callers keep their own wait on purpose: the emulator's
launcher (sim/ imports nothing of the load generator) and the Ansible role's wait_ready.py (runs on the remote
host with nothing of servesweep installed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
import tenacity

T = TypeVar("T")


class ServerError(RuntimeError):
    """A request that got no usable answer. `status`: the HTTP status when there was one; `transient`: whether
    another try may get an answer."""

    def __init__(self, message: str, *, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient

    def prefixed(self, what: str) -> ServerError:
        """The same failure, its message led by what was being done."""
        return ServerError(f"{what}: {self}", status=self.status, transient=self.transient)


@dataclass(frozen=True)
class Retry:
    """How many requests one call may send and how long it waits between them. `also`: statuses transient for
    this call only (SGLang's /flush_cache answers 400 while requests still run)."""

    attempts: int = 4
    first_delay_s: float = 0.5
    max_delay_s: float = 8.0
    also: frozenset[int] = frozenset()


PROBE = Retry()  # 0.5 + 1 + 2 s of back-off: a server that sheds a request now and then still gets probed


def is_transient(e: BaseException, also: frozenset[int] = frozenset()) -> bool:
    return isinstance(e, ServerError) and (e.transient or e.status in also)


def retrying(
    what: str, fn: Callable[[], T], policy: Retry = PROBE, *, before_each: Callable[[], None] | None = None
) -> T:
    """`fn()` until it returns, fails with what is not transient, or has used `policy.attempts`; the error then
    says which attempt it was: `what (attempt N of M): ...`. `before_each` runs before every attempt (a counter of
    requests sent)."""
    attempt = 0

    def before(_state: tenacity.RetryCallState) -> None:
        nonlocal attempt
        attempt += 1
        if before_each is not None:
            before_each()

    retryer = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=tenacity.wait_exponential(multiplier=policy.first_delay_s, max=policy.max_delay_s),
        retry=tenacity.retry_if_exception(lambda e: is_transient(e, policy.also)),
        before=before,
        reraise=True,
    )
    try:
        return retryer(fn)
    except (RuntimeError, OSError) as e:
        raise ServerError(
            f"{what} (attempt {attempt} of {policy.attempts}): {e}",
            status=getattr(e, "status", None),
            transient=is_transient(e, policy.also),
        ) from None


def headers(api_key: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """JSON in, an uncompressed answer out (a stream's bytes arrive as sent), `extra` headers, the API key."""
    h = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    h.update(extra or {})
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")


def _reason(e: Exception) -> str:
    """The OS's words for a failed connection ("[Errno 111] Connection refused"), not urllib3's object reprs."""
    m = _ERRNO.search(str(e))
    return m.group(0) if m else str(e)[:300] or type(e).__name__


def send(
    method: str,
    url: str,
    *,
    body: Any = None,
    api_key: str | None = None,
    extra_headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    stream: bool = False,
) -> requests.Response:
    """One request; an answer of 400 or more, no connection or no answer within `timeout` (connect, and each
    read) raise ServerError. `body` is sent as JSON; None sends no body. Use the answer as a context manager."""
    data = json.dumps(body).encode() if body is not None else None
    try:
        r = requests.request(
            method, url, data=data, headers=headers(api_key, extra_headers), timeout=timeout, stream=stream
        )
    except requests.Timeout:
        raise ServerError(f"{method} {url}: no answer within {timeout:g} s", transient=True) from None
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as e:
        raise ServerError(f"{method} {url}: cannot reach the server ({_reason(e)})", transient=True) from None
    except requests.RequestException as e:
        raise ServerError(f"{method} {url}: {e}") from None
    if r.status_code >= 400:
        with r:
            detail = _read(r, method, url)[:500].decode("utf-8", "replace")
        raise ServerError(
            f"{method} {url} answered HTTP {r.status_code}: {detail}",
            status=r.status_code,
            transient=r.status_code == 429 or r.status_code >= 500,
        )
    return r


def _read(r: requests.Response, method: str, url: str) -> bytes:
    try:
        return r.content
    except requests.RequestException as e:
        raise ServerError(f"{method} {url}: the answer broke off ({_reason(e)})", transient=True) from None


def status(method: str, url: str, **kw: Any) -> int:
    """The status of an answer below 400, its body read and dropped."""
    with send(method, url, **kw) as r:
        _read(r, method, url)
        return r.status_code


def get_text(url: str, **kw: Any) -> str:
    with send("GET", url, **kw) as r:
        return _read(r, "GET", url).decode("utf-8", "replace")


def _json(method: str, url: str, **kw: Any) -> Any:
    with send(method, url, **kw) as r:
        raw = _read(r, method, url)
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ServerError(f"{method} {url} did not answer JSON: {e}") from None


def get_json(url: str, **kw: Any) -> Any:
    return _json("GET", url, **kw)


def post_json(url: str, body: Any, **kw: Any) -> Any:
    return _json("POST", url, body=body, **kw)


def stream_events(url: str, body: Any, **kw: Any) -> Iterator[dict]:
    """POST a streaming request; yield each server-sent event's JSON object. The stream is read to its end (past
    `[DONE]`), so the request ends as a normal one does: closing it early counts as an abort in the server's own
    metrics (SGLang's num_aborted_requests_total). An event that carries `error` raises a transient ServerError."""
    with send("POST", url, body=body, stream=True, **kw) as r:
        try:
            for raw in r.iter_lines():
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                try:
                    ev = json.loads(line[5:])
                except ValueError:
                    continue
                if isinstance(ev, dict) and "error" in ev:
                    raise ServerError(f"POST {url}: in-stream error {ev['error']}", transient=True)
                if isinstance(ev, dict):
                    yield ev
        except requests.RequestException as e:
            raise ServerError(f"POST {url}: the stream broke off ({_reason(e)})", transient=True) from None


def wait_ready(
    url: str,
    *,
    timeout_s: float,
    poll_s: float = 0.1,
    check: Callable[[], None] | None = None,
    request_timeout_s: float = 2.0,
) -> bool:
    """Poll GET `url` until it answers 200 (True) or `timeout_s` has passed (False). `check` runs before each
    poll and raises to give up at once (the server's process exited)."""

    def ready() -> bool:
        if check is not None:
            check()
        try:
            return status("GET", url, timeout=request_timeout_s) == 200
        except ServerError:
            return False

    return tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout_s),
        wait=tenacity.wait_fixed(poll_s),
        retry=tenacity.retry_if_result(lambda ok: not ok),
        retry_error_callback=lambda _state: False,
    )(ready)
