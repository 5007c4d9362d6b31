"""A point's load (`user.LoadContext`: its resolved point, pre-encoded prompt bodies, headers) for the users of one
Locust process, built before they start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from servesweep.client.user import LoadContext
from servesweep.config.point import LoadPoint


def build_context(point: LoadPoint) -> LoadContext:
    """Resolve what the point left open (model, template overhead, continuous usage) and pre-encode the bodies."""
    from servesweep.config.secrets import api_key_for
    from servesweep.target.probes import resolve_point
    from servesweep.workload.build import build_workload

    point = resolve_point(point)
    # a trace point's bodies are sent at the trace's slots, body i at request i's: this user does (user.py)
    w = build_workload(point, trace_replay=point.workload == "trace")
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "Accept-Encoding": "identity",
    }
    headers.update(point.headers)
    key = api_key_for(point)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return LoadContext(
        point=point,
        bodies=w.bodies,
        nonce_digits=w.nonce_digits,
        headers=headers,
        path=w.path,
        nonce_format=w.nonce_format,
        output_tokens=w.output_tokens,
        agent=w.agent,
        trace=w.trace,
    )


# The fields a fresh context shares with a prebuilt one; every other field (its pid, clock anchor, nonce start and
# prompt order, counters, buffer) is the new process's own.
_SHARED = (
    "point",
    "bodies",
    "nonce_digits",
    "headers",
    "path",
    "nonce_format",
    "output_tokens",
    "agent",
    "trace",
)


@dataclasses.dataclass(frozen=True)
class Prebuilt:
    """The load of a --point-json file, built once before Locust's --processes forks its workers."""

    text: str  # the file's text, which the context was built from
    context: LoadContext

    def context_for(self, point_json: str | None, point: LoadPoint) -> LoadContext:
        """A fresh context of `point` for this process: from the prebuilt bodies when the file is unchanged."""
        if point_json and Path(point_json).read_text() == self.text:
            return LoadContext(**{k: getattr(self.context, k) for k in _SHARED})
        return build_context(point)


def prebuild(argv: list[str]) -> Prebuilt | None:
    """With --point-json in `argv` (what run_point passes), build the bodies now, when Locust imports the
    locustfile: that is before `--processes` forks its workers (Locust has no event between parsing the options and
    the fork), so they start measuring at once instead of each building for seconds. None without the option or
    when building fails (init builds again and reports the error where Locust shows it)."""
    if "--point-json" not in argv or argv.index("--point-json") + 1 >= len(argv):
        return None
    path = argv[argv.index("--point-json") + 1]
    try:
        text = Path(path).read_text()
        return Prebuilt(text, build_context(LoadPoint.model_validate_json(text)))
    except Exception:  # noqa: BLE001 - init builds it again and reports the error where Locust shows it
        return None


def context_for(prebuilt: Prebuilt | None, point_json: str | None, point: LoadPoint) -> LoadContext:
    if prebuilt is None:
        return build_context(point)
    return prebuilt.context_for(point_json, point)
