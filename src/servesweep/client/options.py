"""servesweep's options on Locust's command line and in the web UI's start form, and the point they make.

The point of a run servesweep started is its --point-json file, and only that: Locust's own options that carry a
value of the point (--host, -u) are set from it here at init (`locust_options_from_point`), never given beside it;
one given anyway that disagrees with the point is refused. By hand (no --point-json) the point is built from the
knobs' options, Locust's --host and -u (`point_from_options`).
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from servesweep.config.point import DEFAULT_MAX_FAILURE_RATE, Knob, LoadPoint, knob_values, knobs

log = logging.getLogger("servesweep")

FOREVER = 3.0e7  # seconds: "no duration of our own"


class NoStopTimeout(float):
    """Locust's --stop-timeout default, told apart from an explicit `-s 0` (argv, LOCUST_STOP_TIMEOUT, a config
    file: those arrive as plain numbers). Equal to 0 in every use; replaced by a plain float at init."""


NO_STOP_TIMEOUT = NoStopTimeout(0.0)


class GroupedArguments:
    """A Locust parser's add_argument that puts each option in an argument group named by its help's "[group]"
    prefix ("servesweep: load shape"; "servesweep: run" without one), so that --help lists servesweep's options
    by group after Locust's own. Locust's extra keywords (include_in_web_ui, is_secret, ...) exist only on the
    parser's own add_argument: here they are set on the action as LocustArgumentParser does, so the web UI still
    finds the option (the groups share the parser's list of actions)."""

    UI_KEYWORDS = {"include_in_web_ui": True, "is_secret": False, "is_required": False, "is_multiple": False}

    def __init__(self, parser) -> None:
        self.parser = parser
        # on the parser: the web UI module's options join the same titles
        self.groups: dict[str, argparse._ArgumentGroup] = parser.__dict__.setdefault("servesweep_groups", {})

    def group(self, help_text: str) -> argparse._ArgumentGroup:
        title = help_text[1 : help_text.index("]")] if help_text.startswith("[") else "run"
        if title not in self.groups:
            self.groups[title] = self.parser.add_argument_group(f"servesweep: {title}")
        return self.groups[title]

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        ui = {k: kwargs.pop(k, default) for k, default in self.UI_KEYWORDS.items()}
        action = self.group(kwargs.get("help") or "").add_argument(*args, **kwargs)
        for k, v in ui.items():
            setattr(action, k, v)
        return action


def add_arguments(parser, *, ui_module: bool) -> None:
    """Every servesweep option. The start form lists its parameters in the order they are added: the ramp (with the
    web UI module) and the load shape first, then each group of the knobs' table (config.point.GROUPS); --help
    lists them under one title per group."""
    # The web UI starts load against a GPU server: bind it to loopback unless told otherwise (--web-host).
    # No -s given: a headless run picks the point's stop timeout itself (settle_stop_timeout), instead of dropping
    # every stream still running at -t.
    parser.set_defaults(web_host="127.0.0.1", stop_timeout=NO_STOP_TIMEOUT)
    grouped = GroupedArguments(parser)
    if ui_module:
        from servesweep.client.shapes import add_ramp_arguments

        add_ramp_arguments(grouped)
    for k in knobs("form"):
        add_knob_argument(grouped, k)
    run_arguments(grouped, ui_module=ui_module)


def add_knob_argument(parser, k: Knob) -> None:
    """One knob of the table as a Locust option shown in the start form, its group and CLI name in the help. Unset
    optional values are empty text (the form keeps an option's type, and None has none); Knob.value reads them."""
    kw: dict = {
        "default": k.option_default("form"),
        "help": f"[{k.group}] {k.help} ({k.cli})".replace("%", "%%"),
    }
    if k.kind == "flag":
        kw["action"] = "store_true"
    elif k.kind == "switch":
        kw["choices"] = ["", "on", "off"]
    elif k.kind == "choice":
        kw["choices"] = list(k.choices)
    elif not k.optional and k.kind not in ("text", "json"):  # json: text a Knob.value parses
        kw["type"] = int if k.kind == "int" else float
    parser.add_argument(k.cli, include_in_web_ui=True, **kw)


def run_arguments(parser, *, ui_module: bool) -> None:
    """The options of a Locust run that are not one point's knobs (servesweep passes most; --slo is in the form)."""

    def opt(*a, ui=False, **kw):
        parser.add_argument(*a, include_in_web_ui=ui, **kw)

    opt(
        "--point-json",
        default=None,
        help="a LoadPoint JSON file: the whole point (the knobs' options are not read; --host and -u come from it)",
    )
    opt(
        "--slo",
        default="",
        ui=True,
        help="SLOs checked at the end, e.g. 'ttft_p99<=2s,itl_p99<=50ms'; breach: exit 1",
    )
    opt("--records", default="", help="write per-request records (Parquet) here at the end")
    opt("--progress-file", default="", help="rewrite {issued, completed, failed} here every second")
    opt(
        "--split-workers",
        type=int,
        default=0,
        help="worker processes the point's request budget and arrival rate are split over (0: one)",
    )
    opt(
        "--max-failure-rate",
        type=failure_rate,
        default=DEFAULT_MAX_FAILURE_RATE,
        help="headless: exit 3 when more than this share of the measured requests failed (0.05 or 5%%; "
        + f"default {DEFAULT_MAX_FAILURE_RATE:.0%}".replace("%", "%%")  # argparse %-formats the help
        + "; 100%% turns it off); any failure within it is a warning and exits 0 (it replaces Locust's "
        "exit-code-on-error rule). Always: exit 3 when no request succeeded",
    )
    if not ui_module:  # the web UI module registers --metrics-port (and installs the exporter) itself
        opt(
            "--metrics-port",
            type=int,
            default=0,
            help="serve the client Prometheus metrics on this port of 127.0.0.1 (0: none)",
        )


# The Locust options that are not knobs of the table (tests/config/test_point_options.py holds the form to it).
RUN_OPTIONS = (
    "point_json",
    "slo",
    "records",
    "progress_file",
    "split_workers",
    "max_failure_rate",
    "metrics_port",
)


def failure_rate(text: str) -> float:
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")  # named below, as an out-of-range share is
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"--max-failure-rate {text}: a share from 0 to 1 (or 0% to 100%)")
    return v


def read_point_json(path: str) -> LoadPoint:
    return LoadPoint.model_validate_json(Path(path).read_text())


def point_from_options(opts, host: str | None) -> LoadPoint | None:
    """The point of the command line (or --point-json); None on a worker started without --host (the master sends
    the host with the first spawn, and the load is built then)."""
    if opts.point_json:
        return read_point_json(opts.point_json)
    if not host:
        if getattr(opts, "worker", False):
            return None
        raise ValueError("give the server with --host http://HOST:PORT")
    fields = knob_values(vars(opts), "form")
    if fields["workload"] not in ("shared_prefix", "agent"):
        fields["shared_prefix_tokens"] = 0  # a value left in the form from another workload
    w, p, o, ep = fields["workload"], fields["prompt_tokens"], fields["output_tokens"], fields["endpoint"]
    return LoadPoint(
        base_url=host,
        concurrency=max(1, int(getattr(opts, "num_users", None) or 1)),
        # by hand, Locust's -t or the UI decide the end of a point without a request budget
        duration_s=FOREVER if fields["requests"] is None else None,
        point_id=f"locust-{w}-p{p}-o{o}-{ep}",
        **fields,
    )


def locust_options_from_point(environment: Any, point: LoadPoint) -> None:
    """--point-json: the point is the one source of what Locust's own options would say of it. Locust reads them
    after the init event, so they are set here instead of on the command line (driver/command.py passes none):
    the host (Locust's environment.host, which a master hands its workers with each spawn), the user count (-u:
    the point's concurrency), the spawn rate (-r: every user within ~0.1 s, a closed loop at full concurrency),
    and on a headless master a -t backstop (settle_run_time). Given on the command line as well and different from
    the point: refused (ValueError), since one of the two would be silently wrong. -s stays Locust's
    (settle_stop_timeout: the point's when not given)."""
    opts = environment.parsed_options
    given = {
        "--host": (opts.host and str(opts.host).rstrip("/"), point.base_url.rstrip("/")),
        "-u/--users": (opts.num_users, point.concurrency),
    }
    clash = [
        f"{k} {mine}, the point's {theirs}"
        for k, (mine, theirs) in given.items()
        if mine not in (None, theirs)
    ]
    if clash:
        raise ValueError(
            f"--point-json {opts.point_json} is the whole point, and the command line says otherwise: "
            + "; ".join(clash)
            + " (leave those options out; Locust also reads them from LOCUST_HOST, LOCUST_USERS and locust.conf)"
        )
    if getattr(opts, "worker", False):
        return  # a worker takes the master's host, users and stop timeout with each spawn
    opts.host = environment.host = point.base_url
    opts.num_users = point.concurrency
    if opts.spawn_rate is None:
        opts.spawn_rate = max(point.concurrency, 1000)


def settle_run_time(environment: Any, point: LoadPoint | None) -> LoadPoint | None:
    """A headless master's end (after settle_stop_timeout), and the point it runs. Servesweep's (--point-json): a
    duration point gets Locust's -t as a backstop only: the locustfile ends the point itself when its time is up (the
    workers finish their streams and ship every record, then the master quits); -t, which would quit the master
    before those records arrive, comes a stop timeout and a margin later (whole seconds, as Locust takes them).
    By hand with -t and no request budget: the point lasts -t (ended the same graceful way), with the same
    backstop after it."""
    opts = environment.parsed_options
    if point is None or not getattr(opts, "headless", False):
        return point
    run_time = getattr(opts, "run_time", None)
    if opts.point_json:
        if point.duration_s is not None and point.duration_s < FOREVER and not run_time:
            opts.run_time = math.ceil(point.warmup_s + point.duration_s + environment.stop_timeout + 30)
        return point
    if not run_time or point.requests is not None or point.duration_s is None or point.duration_s < FOREVER:
        return point
    opts.run_time = math.ceil(run_time + environment.stop_timeout + 30)
    return point.model_copy(update={"duration_s": max(0.001, run_time - point.warmup_s)})


def settle_stop_timeout(environment: Any, point: LoadPoint | None) -> None:
    """Locust's default stop timeout is 0: at -t every stream still running is dropped, and a run whose streams last
    longer than -t ends with 0 records. Headless without -s, take the point's stop timeout instead (what
    `servesweep load` means: min(total, first-token + 4 x stall + 60 s), 1440 s with the defaults): the end waits
    for the running streams only, each bounded by its own timeouts. An explicit -s (even 0) is kept."""
    opts = environment.parsed_options
    given = getattr(opts, "stop_timeout", 0.0)
    if not isinstance(given, NoStopTimeout):
        return
    opts.stop_timeout = 0.0  # a plain float from here on (the spawn message carries the options to workers)
    if not getattr(opts, "headless", False) or getattr(opts, "worker", False) or point is None:
        return  # the web UI keeps Locust's default; a worker takes the master's with each spawn
    st = point.effective_stop_timeout()
    opts.stop_timeout = environment.stop_timeout = st
    if not opts.point_json:  # servesweep's own runs always take it: said only to a person who left -s out
        log.info(
            "servesweep: no -s/--stop-timeout: streams running at the end get up to %g s to finish "
            "(min(total, first-token + 4 x stall + 60 s)); they are measured, not dropped",
            st,
        )
