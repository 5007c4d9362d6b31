"""The emulator's application: SGLang's endpoints over `connection.Connection`, and the process entry point.

One `asyncio.Protocol` per connection parses HTTP/1.1 with httptools (keep-alive, requests served in order).
Generation requests are tokenized, validated like SGLang's tokenizer manager, and handed to the discrete-event
engine (`servesweep.sim.engine`); the engine calls back once per step per request, and each callback writes exactly
one chunk with one `transport.write` built from bytes prepared when the request arrived (no JSON encoding, no
logging per chunk). Everything that is not per-chunk (bodies, errors, /server_info, /metrics) is plain code.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import signal
import sys
import time

from . import logprobs
from . import protocol as P
from .answer_stream import answer_table, greedy_eos_seed, prompt_text, split_fault
from .choices import choice_count, start_choices
from .connection import CHUNKED_END, JSON, METHODS, PROM, SSE, TEXT, Connection, HttpError, Request, head
from .faults import PRE_STREAM, FaultPicker
from .stream import GenerationStream
from .validation import chat_input

log = logging.getLogger("servesweep.sim")


# ====================================================================== the application


# ServerArgs fields of 0.5.23 that no flag sets (so no flag table has them), as real SGLang shows them in
# /server_info for a plain model (its watermark keys redacted by SGLang itself)
SERVER_ARGS_WITHOUT_FLAGS = {
    "_radix_eviction_policy_explicitly_set": False,
    "_speculative_draft_quantization_explicitly_set": False,
    "_swa_full_tokens_ratio_explicitly_set": False,
    "aux_hidden_state_capture": None,
    "custom_sigquit_handler": None,
    "enable_cp_tp_group_sharing": False,
    "grpc_worker_threads": 4,
    "speculative_boundary_reduction": "rs+rsv",
    "stat_loggers": None,
    "uses_mamba_radix_cache": False,
    "watermark_context_window": 4,
    "watermark_default_enabled": False,
    "watermark_enforce_all": False,
    "watermark_key": "<redacted>",
    "watermark_key_b": "<redacted>",
    "watermark_max_probability": 1.0,
    "watermark_mixing_probability": 0.5,
}


def _version(v: str) -> tuple[int, ...]:
    """'0.5.15.post1' -> (0, 5, 15, 1), '0.5.23' -> (0, 5, 23, 0), for ordering versions. The parser (sim/cli.py)
    has checked the form; parsed here so that the server does not import its own command line."""
    nums = [int(n) for n in re.findall(r"\d+", v)]
    return tuple((nums + [0, 0, 0, 0])[:4])


class SimApp:
    def __init__(self, args, resolved, engine_mod):
        self.args = args
        self.resolved = resolved
        self.version = _version(args.sim_sglang_version)
        self.legacy = self.version < (0, 5, 10)
        self.engine_mod = engine_mod
        self.engine = engine_mod.Engine(
            resolved, seed=args.sim_seed, calibration=args.sim_calibration or None
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = False
        self.draining = False
        self.hung = False  # a server-wide hang (sim/faults.py): nothing is answered any more
        self.start_wall = time.time()
        self.served_model_name = args.served_model_name or args.model_path
        self.tokenizer = None
        self.words = None
        self.logprob_tables: dict = {}  # logprobs.table: one per top_logprobs_num asked
        self.eos_id = 0
        self.faults = FaultPicker(args.sim_fault_rate or {}, args.sim_seed)
        self.answer_fault = args.sim_answer_fault  # every request's answer fault, unless it brings its own
        self.speculative = bool(getattr(args, "speculative_algorithm", None))
        self.gt = None
        if args.sim_ground_truth:
            from .groundtruth import GroundTruthWriter

            self.gt = GroundTruthWriter(args.sim_ground_truth)
        self.metrics = None
        if args.enable_metrics:
            from .exposition import SimMetrics

            self.metrics = SimMetrics(
                model_name=self.served_model_name,
                version=self.version,
                resolved=resolved,
                engine=self.engine,
                args=args,
            )
        self.record_chunks = self.gt is not None or self.metrics is not None
        from .power import GpuMeter  # the NVML-shaped stand-in the GPU sampler reads (GET /sim/gpu)

        self.gpu_meter = GpuMeter(
            resolved.gpu.name,
            resolved.tp_size * resolved.dp_size * int(resolved.args.get("pp_size") or 1),
            lambda: self.engine.c_busy_s,
            memory_total_bytes=resolved.gpu.memory_bytes,
            memory_used_bytes=int(resolved.gpu.memory_bytes * resolved.mem_fraction_static),
            power_limit_w=getattr(args, "sim_gpu_power_limit", None),
            throttle=getattr(args, "sim_gpu_throttle", None),
            # the step model prices each step's power share and, under a power limit, its slower compute
            model=self.engine.model,
            nvml_state=getattr(args, "sim_nvml_state", None),
        )
        self.gpu_meter.watch_state()
        self.routes = {
            "/health": self.h_health,
            "/health_generate": self.h_health,
            "/ready": self.h_ready,
            "/model_info": self.h_model_info,
            "/get_model_info": self.h_model_info,
            "/server_info": self.h_server_info,
            "/get_server_info": self.h_server_info,
            "/v1/models": self.h_models,
            "/v1/chat/completions": self.h_chat,
            "/v1/completions": self.h_completion,
            "/generate": self.h_generate,
            "/flush_cache": self.h_flush,
            "/abort_request": self.h_abort,
            "/metrics": self.h_metrics,
            "/v1/loads": self.h_loads,
            "/ping": self.h_ping,
            "/sim/gpu": self.h_sim_gpu,
            "/sim/dcgm": self.h_sim_dcgm,
            "/sim/fault": self.h_sim_fault,
        }
        # rid -> request in flight (for /abort_request abort_all and sglang:http_requests_active)
        self._active: dict[str, GenerationStream] = {}
        if self.metrics is not None:
            self.metrics.active_fn = lambda: len(self._active)

    def log_decode(self, last_steps: int) -> int:
        """SGLang's periodic "Decode batch" line, at most once a second, after --decode-log-interval steps."""
        st = self.engine.stats()
        steps = st.counters.get("decode_steps", 0)
        if steps - last_steps < self.args.decode_log_interval or not log.isEnabledFor(logging.INFO):
            return last_steps if steps >= last_steps else steps
        spec = ""
        if self.resolved.spec_algorithm and st.spec_accept_length:
            spec = f"accept len: {st.spec_accept_length:.2f}, accept rate: {st.spec_accept_rate:.2f}, "
        log.info(
            f"Decode batch, #running-req: {st.num_running_reqs}, #token: {st.num_used_tokens}, "
            f"token usage: {st.token_usage:.2f}, {spec}cuda graph: True, "
            f"gen throughput (token/s): {st.gen_throughput:.2f}, #queue-req: {st.num_queue_reqs}"
        )
        return steps

    # ------------------------------------------------------------------ lifecycle

    def load(self):
        """The slow part of start-up (tokenizer, word table), run in a thread while the port already answers."""
        from servesweep.workload.tokenizer import load_tokenizer

        from .text import build_word_table

        spec = self.args.tokenizer_path
        if spec is None and os.path.isfile(
            os.path.join(os.path.expanduser(self.args.model_path), "tokenizer.json")
        ):
            spec = self.args.model_path
        tok = load_tokenizer(spec)
        self.words = build_word_table(tok, seed=self.args.sim_seed)
        self.eos_id = tok.eos_token_id
        self.tokenizer = tok

    def dispatch(self, conn: Connection, req: Request):
        if self.hung:  # read, never answered: the connection stays busy, later requests on it queue behind
            return
        path = req.path
        handler = self.routes.get(path)
        if handler is None and path.startswith("/v1/models/"):
            handler = self.h_model
        status = 0
        try:
            if handler is None:
                status = 404
                conn.respond(req, 404, b'{"detail":"Not Found"}')
                return
            if req.method not in METHODS.get(path, ("GET",)):
                status = 405
                conn.respond(
                    req,
                    405,
                    b'{"detail":"Method Not Allowed"}',
                    JSON,
                    [("allow", ", ".join(METHODS.get(path, ("GET",))))],
                )
                return
            api_key = self.args.api_key
            if api_key and not (
                path.startswith("/health")
                or path.startswith("/metrics")
                or path in ("/ready", "/sim/gpu", "/sim/dcgm", "/sim/fault")
            ):
                auth = req.headers.get("authorization", "")
                if auth != "Bearer " + api_key:
                    status = 401
                    conn.respond(req, 401, b'{"error":"Unauthorized"}')
                    return
            status = handler(conn, req) or 200
        except HttpError as e:
            status = e.status
            conn.respond(req, e.status, e.body, e.content_type)
        except Exception as e:  # an emulator bug must not look like a hang
            log.exception("handler %s failed", path)
            status = 500
            conn.respond(
                req,
                500,
                P.dumps(
                    {
                        "object": "error",
                        "message": f"Internal server error: {e}",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                ),
            )
        finally:
            if self.metrics is not None and path != "/metrics":
                # the route template, as a middleware sees it: unknown paths must not grow label sets
                if path in self.routes:
                    ep = path
                elif path.startswith("/v1/models/"):
                    ep = "/v1/models/{model}"
                else:
                    ep = "<unmatched>"
                self.metrics.http(ep, req.method, status)

    # ------------------------------------------------------------------ simple endpoints

    def h_health(self, conn, req):
        if not self.ready or self.draining:
            conn.respond(req, 503, b"", None)
            return 503
        conn.respond(req, 200, b"", None)

    def h_ready(self, conn, req):
        return self.h_health(conn, req)

    def h_ping(self, conn, req):
        conn.respond(req, 200, b"pong", TEXT)

    def h_sim_gpu(self, conn, req):
        """NVML's fields per emulated GPU (sim/power.py); POST {"throttle": "power|thermal|none", "power_limit_w": W}
        injects a throttle fault or sets the limit at run time."""
        if req.method == "POST":
            body = self._json(req, need_ctype=False)
            try:
                self.gpu_meter.configure(
                    power_limit_w=body.get("power_limit_w"), throttle=body.get("throttle")
                )
            except (ValueError, TypeError) as e:
                raise HttpError(400, P.dumps({"error": str(e)}), JSON) from None
        conn.respond(req, 200, P.dumps(self.gpu_meter.read()), JSON)

    def h_sim_fault(self, conn, req):
        """Server-wide faults at run time (sim/faults.py): POST {"hang": true} or {"crawl": FACTOR}, with an optional
        "after_s" (default 0); the answer comes first. GET: {"hung": false, "crawl": FACTOR}."""
        if req.method == "POST":
            body = self._json(req, need_ctype=False)
            after = body.get("after_s", 0)
            crawl = body.get("crawl")
            ok = isinstance(after, (int, float)) and 0 <= after < float("inf")
            ok = ok and (body.get("hang") is True) != (crawl is not None)
            ok = ok and (crawl is None or (isinstance(crawl, (int, float)) and 1 <= crawl < float("inf")))
            if not ok:
                raise HttpError(
                    400,
                    P.dumps(
                        {"error": 'expected {"hang": true} or {"crawl": FACTOR >= 1}, and "after_s" >= 0'}
                    ),
                    JSON,
                )
            assert self.loop is not None
            if crawl is None:
                self.loop.call_later(after, self.hang_now, "POST /sim/fault")
            else:
                self.loop.call_later(after, self.crawl_now, float(crawl), "POST /sim/fault")
        state = {"hung": self.hung, "crawl": self.engine.slowdown}
        conn.respond(req, 200, P.dumps(state), JSON)

    def hang_now(self, why: str) -> None:
        """From now on nothing is answered (sim/faults.py). One log line says so: the emulator's record of what
        it injected (a real hung server logs nothing)."""
        if self.hung or self.draining:
            return
        log.warning(f"servesweep sim: hanging now ({why}): connections accepted, nothing answered any more")
        self.hung = True
        self.engine.hang()

    def crawl_now(self, factor: float, why: str) -> None:
        log.warning(f"servesweep sim: every step {factor:g}x slower from now on ({why})")
        self.engine.slowdown = factor

    def h_sim_dcgm(self, conn, req):
        """The same GPUs as a dcgm-exporter's /metrics (its names and labels; sim/power.py dcgm_text)."""
        from .power import dcgm_text

        conn.respond(req, 200, dcgm_text(self.gpu_meter.read()).encode(), PROM)

    def h_model_info(self, conn, req):
        a = self.args
        arch = self.resolved.arch
        info = {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": a.weight_version,
        }
        if self.version >= (0, 5, 10):
            info = {
                "model_path": a.model_path,
                "served_model_name": self.served_model_name,
                "tokenizer_path": a.tokenizer_path or a.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": a.weight_version,
                "load_format": a.load_format,
                "reasoning_parser": a.reasoning_parser,
                "tool_call_parser": a.tool_call_parser,
                "disaggregation_mode": "null",
            }
        info.update(
            has_image_understanding=False,
            has_audio_understanding=False,
            model_type=arch.model_type,
            architectures=list(arch.architectures),
        )
        conn.respond(req, 200, P.dumps(info))

    def server_info(self) -> dict:
        r = self.resolved
        args = {
            k: v for k, v in vars(self.args).items() if not k.startswith("sim_") and k != "launch_command"
        }
        args.update(r.args)
        args["served_model_name"] = self.served_model_name
        # keys of the command line that are not ServerArgs fields: `--config` (a file of flags, read before
        # parsing) and, from 0.5.15 on, the start-up arithmetic's cuda_graph_max_bs (the field is
        # cuda_graph_max_bs_decode there); and ServerArgs fields that no flag sets, with the values real SGLang
        # 0.5.23 shows for a plain model (checked against the running server: tests/sglang_cpu/test_vs_emulator.py)
        args.pop("config", None)
        version = _version(self.args.sim_sglang_version)
        if version >= (0, 5, 15):
            args.pop("cuda_graph_max_bs", None)
        if version >= (0, 5, 23):
            for k, v in SERVER_ARGS_WITHOUT_FLAGS.items():
                args.setdefault(k, v)
            args["uses_mamba_radix_cache"] = bool(getattr(r, "state_slots", 0)) and not args.get(
                "disable_radix_cache"
            )
        # api_key stays: SGLang 0.5.23 shows it here (only the watermark keys are redacted), so the emulator does
        # too, and a run against it catches a key copied unredacted into results (the role's probe redacts it)
        if r.spec_algorithm:
            args["speculative_algorithm"] = r.spec_algorithm
        st = self.engine.stats()
        internal = dict(args)
        internal.update(
            world_size=r.tp_size,
            effective_max_running_requests_per_dp=r.effective_max_running_requests,
            last_gen_throughput=st.gen_throughput,
            memory_usage=r.memory_usage,
        )
        if r.spec_algorithm and st.spec_accept_length:
            internal["avg_spec_accept_length"] = st.spec_accept_length
        startup: float | dict = self.start_wall
        if version >= (0, 5, 23):
            # 0.5.23's scheduler reports its start-up phases (seconds) and its decode CUDA graphs; the emulator's
            # start-up is --sim-load-time, and it captures no graphs
            load = float(self.args.sim_load_time)
            graphs = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                                    "draft_extend"), 0.0)  # fmt: skip
            phases = {
                "load_weight": load,
                "kv_cache_allocation": 0.0,
                "scheduler_e2e": load,
                "cuda_graph": graphs,
            }
            graph = (r.memory_usage or {}).get("graph") if isinstance(r.memory_usage, dict) else None
            internal.update(startup_time=phases, decode_cuda_graph_bs=[],
                            decode_cuda_graph_memory_gb=float((graph or {}).get("decode", 0.0) or 0.0))  # fmt: skip
            startup = {**phases, "tokenizer_e2e": load}  # the tokenizer manager adds its own phase
            internal.pop("custom_sigquit_handler", None)  # a launcher field the scheduler's copy lacks
        out = dict(args)
        out.update(
            launch_command=self.args.launch_command,
            status="ready" if self.ready else "starting",
            max_total_num_tokens=r.max_total_num_tokens,
            max_req_input_len=r.max_req_input_len,
            startup_time=startup,
            hicache_object_layout=None,
            kv_events=None,
            internal_states=[internal] * max(1, r.dp_size),
            version=self.args.sim_sglang_version,
            frontend="python",
            # not SGLang's: the flags given that the emulator accepts but does not model (sim/cli.py)
            sim_unmodeled_flags=list(self.args.sim_unmodeled_flags),
        )
        return out

    def h_server_info(self, conn, req):
        conn.respond(req, 200, json.dumps(self.server_info(), separators=(",", ":"), default=str).encode())

    def _model_card(self) -> dict:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.args.model_path,
            "parent": None,
            "max_model_len": self.resolved.context_len,
        }

    def h_models(self, conn, req):
        conn.respond(req, 200, P.dumps({"object": "list", "data": [self._model_card()]}))

    def h_model(self, conn, req):
        mid = req.path[len("/v1/models/") :]
        from urllib.parse import unquote

        mid = unquote(mid)
        if mid != self.served_model_name:
            conn.respond(req, 404, P.model_not_found_body(mid))
            return 404
        conn.respond(req, 200, P.dumps(self._model_card()))

    def h_flush(self, conn, req):
        body = (
            b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            b"requests, the operation will not be performed.)\n"
        )
        ok = self.engine.flush_cache()
        # SGLang answers a plain Response: no content type; a refused flush (anything running or waiting) has
        # the scheduler's empty message, so http_server.py's "Flush cache failed.\n"
        conn.respond(req, 200 if ok else 400, body if ok else b"Flush cache failed.\n", None)
        return 200 if ok else 400

    def h_abort(self, conn, req):
        body = self._json(req, need_ctype=False)
        if body.get("abort_all"):
            for rid in list(self.active_rids):
                self.engine.abort(rid)
        elif body.get("rid"):
            self.engine.abort(str(body["rid"]))
        conn.respond(req, 200, b"", None)

    def h_metrics(self, conn, req):
        if self.metrics is None:
            conn.respond(req, 404, b'{"detail":"Not Found"}')
            return 404
        conn.respond(req, 200, self.metrics.render(), PROM)

    def h_loads(self, conn, req):
        st = self.engine.stats()
        r = self.resolved
        load = {
            "dp_rank": 0,
            "num_running_reqs": st.num_running_reqs,
            "num_waiting_reqs": st.num_queue_reqs,
            "num_used_tokens": st.num_used_tokens,
            "max_total_num_tokens": r.max_total_num_tokens,
            "token_usage": st.token_usage,
            "gen_throughput": st.gen_throughput,
            "cache_hit_rate": st.cache_hit_rate,
        }
        conn.respond(
            req,
            200,
            P.dumps({"timestamp": time.time(), "version": self.args.sim_sglang_version, "loads": [load]}),
        )

    # ------------------------------------------------------------------ generation

    def _json(self, req: Request, need_ctype: bool = True) -> dict:
        if need_ctype:
            ct = req.headers.get("content-type", "").lower().split(";", 1)[0].strip()
            if ct != "application/json":
                errs = [
                    {
                        "loc": ["header", "content-type"],
                        "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                        "type": "value_error",
                    }
                ]
                raise HttpError(400, P.validation_error_body(errs, None, self.version))
        if not req.body:
            if need_ctype:
                raise HttpError(
                    400,
                    P.validation_error_body(
                        [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}],
                        req.path,
                        self.version,
                    ),
                )
            return {}
        try:
            obj = json.loads(req.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            pos = getattr(e, "pos", 0)
            msg = getattr(e, "msg", str(e))
            raise HttpError(
                400,
                P.validation_error_body(
                    [
                        {
                            "type": "json_invalid",
                            "loc": ("body", pos),
                            "msg": "JSON decode error",
                            "input": {},
                            "ctx": {"error": msg},
                        }
                    ],
                    req.path,
                    self.version,
                ),
            ) from None
        if not isinstance(obj, dict):
            raise HttpError(
                400,
                P.validation_error_body(
                    [
                        {
                            "type": "model_attributes_type",
                            "loc": ("body",),
                            "msg": "Input should be a valid dictionary or object to extract fields from",
                            "input": obj,
                        }
                    ],
                    req.path,
                    self.version,
                ),
            )
        return obj

    def _not_ready(self):
        if self.draining:
            raise HttpError(503, P.error_body("The server is shutting down.", 503))
        if self.tokenizer is None:
            raise HttpError(503, P.error_body("The server is not ready yet (loading).", 503))

    def _field_error(self, req, field: str, msg: str, kind: str = "value_error", value=None):
        err = {"type": kind, "loc": ("body", field), "msg": msg, "input": value}
        if kind == "value_error":  # pydantic keeps the validator's exception
            err["ctx"] = {"error": ValueError(msg.removeprefix("Value error, "))}
        return HttpError(400, P.validation_error_body([err], req.path, self.version))

    def _logprob_fields(self, req, kind: str, body: dict) -> None:
        errs = logprobs.field_errors(kind, body)
        if errs:
            raise HttpError(400, P.validation_error_body(errs, req.path, self.version))

    def h_chat(self, conn, req):
        body = self._json(req)
        self._not_ready()
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise self._field_error(
                req,
                "messages",
                "Field required" if msgs is None else "Input should be a valid list",
                "missing" if msgs is None else "list_type",
                chat_input(body) if msgs is None else msgs,
            )
        self._logprob_fields(req, "chat", body)
        from servesweep.workload.tokenizer import render_chatml

        ctk = body.get("chat_template_kwargs") or {}
        try:
            text = render_chatml(msgs, enable_thinking=ctk.get("enable_thinking", True) is not False)
        except (
            Exception
        ) as e:  # a malformed message list is a templating ValueError in SGLang: 400 BadRequest
            raise HttpError(
                400, P.error_body(f"Failed to apply chat template: {e}", 400, "BadRequest")
            ) from None
        max_new = body.get("max_completion_tokens")
        if max_new is None:
            max_new = body.get("max_tokens")
        return self._start(conn, req, body, "chat", text, None, max_new)

    def h_completion(self, conn, req):
        body = self._json(req)
        self._not_ready()
        prompt = body.get("prompt")
        if prompt is None:
            raise self._field_error(req, "prompt", "Field required", "missing", body)
        ids = None
        if isinstance(prompt, list):
            if prompt and all(isinstance(x, int) for x in prompt):
                ids, prompt = prompt, None
            elif len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            else:
                raise HttpError(
                    400, P.error_body("The emulator serves one prompt per request (no batches).", 400)
                )
        elif not isinstance(prompt, str):
            raise self._field_error(req, "prompt", "Input should be a valid string", "string_type", prompt)
        self._logprob_fields(req, "completion", body)
        max_new = body.get("max_tokens", 16)
        if max_new is not None and (not isinstance(max_new, int) or max_new <= 0):
            raise self._field_error(
                req, "max_tokens", "Value error, max_tokens must be positive", "value_error", max_new
            )
        return self._start(conn, req, body, "completion", prompt, ids, max_new)

    def h_generate(self, conn, req):
        body = self._json(req, need_ctype=False)
        self._not_ready()
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise HttpError(
                400, P.dumps({"error": {"message": "Either text or input_ids should be provided."}})
            )
        if isinstance(text, list):
            return self._generate_batch(conn, req, body, text)
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return self._generate_batch(conn, req, body, ids)
        sp = body.get("sampling_params") or {}
        merged = {
            "stream": body.get("stream", False),
            "ignore_eos": sp.get("ignore_eos", False),
            "rid": body.get("rid"),
            "extra_key": body.get("extra_key"),
            "cache_salt": body.get("cache_salt"),
        }
        return self._start(conn, req, merged, "generate", text, ids, sp.get("max_new_tokens", 128))

    def _start(self, conn, req, body, kind, text, ids, max_new):
        """Tokenize, validate against the context length, then submit (maybe after a slow-first-byte fault)."""
        try:
            fault = self.faults.pick(req.headers.get("x-sim-fault"))
        except ValueError as e:
            raise HttpError(400, P.error_body(str(e), 400)) from None
        if fault is not None and fault.kind in PRE_STREAM:
            status = int(fault.kind)
            msg = f"{PRE_STREAM[fault.kind]} (injected fault)"
            self._record_early(req, body, status, fault)
            conn.respond(req, status, P.error_body(msg, status))
            return status
        if ids is None:
            assert self.tokenizer is not None and self.loop is not None  # _not_ready() let the request in
            if len(text) > 16384:  # long prompts tokenize off the event loop (tiktoken releases the GIL)
                fut = self.loop.run_in_executor(None, self.tokenizer.encode, text)
                fut.add_done_callback(
                    lambda f: self._after_tokenize(conn, req, body, kind, f, max_new, fault)
                )
                return 200
            ids = self.tokenizer.encode(text)
        return self._validated(conn, req, body, kind, ids, max_new, fault)

    def _after_tokenize(self, conn, req, body, kind, fut, max_new, fault):
        try:
            ids = fut.result()
            self._validated(conn, req, body, kind, ids, max_new, fault)
        except HttpError as e:
            conn.respond(req, e.status, e.body, e.content_type)

    def _validated(self, conn, req, body, kind, ids, max_new, fault):
        r = self.resolved
        ctx = r.context_len
        n = len(ids) + r.num_reserved_tokens
        stream = bool(body.get("stream", False))
        if n >= ctx:
            if self.args.allow_auto_truncate:
                ids = ids[: max(1, ctx - 1 - r.num_reserved_tokens)]
                n = len(ids) + r.num_reserved_tokens
            else:
                return self._reject(conn, req, kind, P.context_too_long(n, ctx), body, len(ids))
        if max_new is not None:
            if not isinstance(max_new, int) or max_new < 0:
                raise self._field_error(
                    req, "max_tokens", "Input should be a valid integer", "int_type", max_new
                )
            if n + max_new > ctx:
                if self.args.allow_auto_truncate:
                    max_new = max(0, ctx - n)
                else:
                    return self._reject(conn, req, kind, P.context_exceeded(n, max_new, ctx), body, len(ids))
        else:
            max_new = max(1, ctx - n - 1)
        if fault is not None and fault.kind == "slow_first_byte":
            assert self.loop is not None  # set before the server serves
            self.loop.call_later(fault.arg, self._submit, conn, req, body, kind, ids, max_new, fault, stream)
            return 200
        return self._submit(conn, req, body, kind, ids, max_new, fault, stream)

    def _reject(self, conn, req, kind, msg, body=None, n=0):
        status = self._reject_write(conn, req, kind, msg)
        self._record_early(req, body or {}, status, None, n)
        return status

    def _reject_write(self, conn, req, kind, msg):
        if kind == "generate":
            # native /generate: 400 {"error":{"message":..}} (non-stream); stream: 200 + error event
            if self._stream_of(req):
                payload = P.dumps(
                    {
                        "error": {
                            "message": msg,
                            "type": "invalid_request_error",
                            "code": 400,
                            "retryable": False,
                        }
                    }
                )
                data = b"data: " + payload + b"\n\n" + P.DONE
                conn.transport.write(
                    head(200, SSE, None) + b"%x\r\n%s\r\n%s" % (len(data), data, CHUNKED_END)
                )
                conn.done(req)
                return 200
            conn.respond(req, 400, P.dumps({"error": {"message": msg}}))
            return 400
        conn.respond(req, 400, P.error_body(msg, 400))
        return 400

    @staticmethod
    def _stream_of(req) -> bool:
        try:
            return bool(json.loads(req.body).get("stream"))
        except Exception:
            return False

    @property
    def active_rids(self):
        return self._active.keys()

    def _generate_batch(self, conn, req, body, items: list):
        """Native batched /generate (as `sglang.bench_one_batch_server` sends it): one engine request per item;
        streamed events carry `"index"`, `[DONE]` ends the whole batch; non-stream answers a JSON list."""
        n = len(items)
        if n == 0:
            raise HttpError(400, P.dumps({"error": {"message": "The batch is empty."}}))
        assert self.tokenizer is not None  # _not_ready() let the request in

        def per(key, default=None):
            v = body.get(key)
            return v[i] if isinstance(v, list) else (default if v is None else v)

        stream = bool(body.get("stream", False))
        prepared = []
        ctx = self.resolved.context_len
        for i in range(n):
            item = items[i]
            ids = self.tokenizer.encode(item) if isinstance(item, str) else list(item)
            sp = per("sampling_params", {}) or {}
            max_new = sp.get("max_new_tokens", 128)
            k = len(ids) + self.resolved.num_reserved_tokens
            msg = None
            if k >= ctx:
                msg = P.context_too_long(k, ctx)
            elif max_new is not None and k + max_new > ctx:
                msg = P.context_exceeded(k, max_new, ctx)
            if msg is not None:
                return self._reject(conn, req, "generate", msg, body, len(ids))
            sub = {
                "stream": stream,
                "ignore_eos": sp.get("ignore_eos", False),
                "rid": per("rid"),
                "extra_key": per("extra_key"),
                "cache_salt": per("cache_salt"),
            }
            prepared.append((sub, ids, max_new))
        group = BatchGroup(self, conn, req, stream, n)
        if stream:
            conn.transport.write(head(200, SSE, None))
        conn.active = group
        for i, (sub, ids, max_new) in enumerate(prepared):
            if conn.closed:
                break
            self._submit(conn, req, sub, "generate", ids, max_new, None, stream, group=group, index=i)
        return 200

    def _submit(self, conn, req, body, kind, ids, max_new, fault, stream, group=None, index=None):
        if conn.closed:
            return 499
        if group is None and kind != "generate" and choice_count(body) > 1:
            return start_choices(self, conn, req, body, kind, ids, max_new, stream)
        rid = body.get("rid") or P.new_id()
        if not isinstance(rid, str):
            rid = str(rid)
        model = body.get("model", "default") if kind != "generate" else self.served_model_name
        fault, answer_fault = split_fault(fault, self.answer_fault)
        top_k = logprobs.requested(kind, body)
        # logprobs asked for: their own class, so the others' chunk path is untouched
        cls, extra = (GenerationStream, {}) if top_k is None else (logprobs.LogprobStream, {"top_k": top_k})
        g = cls(
            self, conn, req, kind, stream, str(model), len(ids), max_new, fault, rid, body,
            choice=index or 0, created=getattr(group, "created", None), **extra,
        )  # fmt: skip
        if group is not None:
            g.group, g.index = group, index
            group.members.append(g)
            if index is not None and req.headers.get("x-request-id"):
                g.gt_id = f"{req.headers['x-request-id']}#{index}"
        ns = body.get("cache_salt") or body.get("extra_key")
        ereq = self.engine_mod.EngineRequest(
            rid=rid,
            prompt_ids=ids,
            max_new_tokens=max_new,
            emit=g.on_tokens,
            ignore_eos=bool(body.get("ignore_eos", False)),
            cache_namespace=str(ns) if ns else None,
            eos_seed=greedy_eos_seed(body, ids),
        )
        g.ereq = ereq
        if group is not None:
            g.headers_ns = group.headers_ns
        else:
            if stream:
                conn.transport.write(head(200, SSE, None))
                g.headers_ns = time.monotonic_ns()
            conn.active = g
        self._active[rid] = g
        try:
            self.engine.submit(ereq)
        except ValueError as e:  # a duplicate client-supplied rid
            self._active.pop(rid, None)
            if group is not None:
                g.ereq.finish_reason = "abort"
                g.ereq.abort_status, g.ereq.abort_message = 400, str(e)
                g._finish()
                return 200
            conn.active = None
            if stream:
                g.done = True
                g._write_end(P.stream_error_event(str(e), 400) + P.DONE)
                conn.done(req)
                return 200
            conn.respond(req, 400, P.error_body(str(e), 400))
            return 400
        except self.engine_mod.QueueFull:
            ereq.finish_reason = "abort"
            ereq.abort_status = 503
            ereq.abort_message = P.QUEUE_FULL
            g._finish()
            return 200
        if g.reasoning_left:
            # think for the first half of what this request will really generate (its EOS draw, when the engine
            # has made one), so an uncapped request still gets an answer after its thinking
            target = getattr(ereq, "_target", 0) or max_new
            g.reasoning_left = min(g.reasoning_left, max(1, target // 2))
        if kind != "generate":  # /generate streams token ids too: it keeps the word table
            g.wt = answer_table(
                prompt_text(kind, body),
                getattr(ereq, "_target", 0) or max_new or 1,
                g.reasoning_left,
                seed=self.args.sim_seed,
                fault=answer_fault,
                prompt_tokens=len(ids),
                speculative=self.speculative,
                tokenizer=self.tokenizer,
            )
            g.word = 0
        return 200

    def _record_early(self, req, body, status, fault=None, prompt_tokens=0):
        """Ground truth of a generation request answered before it reached the engine (fault or rejection)."""
        if self.gt is not None:
            now = time.monotonic_ns()
            self.gt.add(
                {
                    "id": req.headers.get("x-request-id") or P.new_id(),
                    "response_id": None,
                    "endpoint": req.path,
                    "stream": bool(body.get("stream", False)),
                    "recv_ns": req.recv_ns,
                    "headers_ns": now,
                    "chunks": [],
                    "end_ns": now,
                    "status": status,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": 0,
                    "cached_tokens": 0,
                    "finish_reason": None,
                    "fault": None if fault is None else str(fault),
                }
            )


class BatchGroup:
    """The sub-requests of one batched /generate: one HTTP response, ended when the last of them finishes."""

    def __init__(self, app, conn, req, stream: bool, n: int):
        self.app, self.conn, self.req, self.stream, self.n = app, conn, req, stream, n
        self.members: list[GenerationStream] = []
        self.bodies: list = [None] * n
        self.left = n
        self.headers_ns = time.monotonic_ns()

    def member_done(self, g, body_obj=None) -> None:
        if body_obj is not None:
            self.bodies[g.index] = body_obj
        self.left -= 1
        if self.left:
            return
        conn = self.conn
        if conn.closed:
            return
        if self.stream:
            conn.transport.write(b"%x\r\n%s\r\n%s" % (len(P.DONE), P.DONE, CHUNKED_END))
            conn.done(self.req)
        else:
            conn.respond(self.req, 200, P.dumps(self.bodies))

    def client_gone(self) -> None:
        for g in self.members:
            g.client_gone()


# ====================================================================== entry point


def run_server(args) -> int:
    """Resolve the server like SGLang, print its start-up lines, serve until SIGTERM/SIGINT."""
    _configure_logging(args.log_level)
    from servesweep.sglang.serverargs import resolve_server

    from . import engine as engine_mod

    resolve_args = {k: v for k, v in vars(args).items() if k != "launch_command"}
    try:
        resolved = resolve_server(resolve_args, os.environ)
    except ValueError as e:
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    _lift_descriptor_limit()
    loop = _new_event_loop()
    try:
        app = SimApp(args, resolved, engine_mod)
    except ValueError as e:  # e.g. an unknown --sim-calibration key or profile
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    app.loop = loop
    for line in resolved.log_lines:
        log.info(line)
    # SGLang 0.5.23 logs its server args at start, api_key included (entrypoints/engine.py redacts only the
    # watermark keys): the same line here, so a server log copied into results unredacted shows the key
    log.info(
        f"server_args={{'model_path': {args.model_path!r}, 'api_key': {getattr(args, 'api_key', None)!r}}}"
    )
    if args.sim_unmodeled_flags:
        log.info(f"servesweep sim: accepted, not modeled: {', '.join(args.sim_unmodeled_flags)}")

    server = loop.run_until_complete(
        loop.create_server(
            lambda: Connection(app), host=args.host, port=args.port, reuse_address=True, backlog=4096
        )
    )
    port = server.sockets[0].getsockname()[1]
    log.info(f"Uvicorn running on http://{args.host}:{port} (Press CTRL+C to quit)")
    app.engine.start(loop)
    stop, force = _stop_signals(loop)
    try:
        loop.run_until_complete(_serve(app, loop, server, stop, force, args.sim_load_time))
    finally:
        if app.gt is not None:
            app.gt.close()
    return 0


def _configure_logging(level) -> None:
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )


def _lift_descriptor_limit() -> None:
    """Thousands of concurrent streams need as many descriptors: lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )
    except (ImportError, ValueError, OSError):
        pass


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop


def _stop_signals(loop) -> tuple[asyncio.Future, asyncio.Future]:
    """Futures set by SIGTERM/SIGINT. The first signal drains (as SGLang: /health 503, running requests finish,
    new ones are refused); a second one, or SGL_FORCE_SHUTDOWN=1, exits at once."""
    stop = loop.create_future()
    force = loop.create_future()

    def _signal(*_):
        if not stop.done():
            stop.set_result(True)
        elif not force.done():
            force.set_result(True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _signal)
    return stop, force


async def _startup(app, loop, load_time: float) -> None:
    """Load the tokenizer and tables, wait out the rest of --sim-load-time, then answer /health 200."""
    t0 = time.monotonic()
    await loop.run_in_executor(None, app.load)
    # The tokenizer and word tables live forever: keep the cyclic GC from rescanning them, and collect the
    # young generation less often (per-chunk work allocates a little; full scans are what cause stalls).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)
    rest = load_time - (time.monotonic() - t0)
    if rest > 0:
        await asyncio.sleep(rest)
    app.ready = True
    log.info("The server is fired up and ready to roll!")
    args = app.args
    if getattr(args, "sim_hang_after", None) is not None:
        loop.call_later(args.sim_hang_after, app.hang_now, f"--sim-hang-after {args.sim_hang_after:g}")
    if getattr(args, "sim_crawl_after", None) is not None:
        after, factor = args.sim_crawl_after
        loop.call_later(after, app.crawl_now, factor, f"--sim-crawl-after {after:g}:{factor:g}")


async def _flusher(app) -> None:
    """Once a second: the ground truth to disk, SGLang's decode log line."""
    last_steps = 0
    while True:
        await asyncio.sleep(1.0)
        if app.gt is not None:
            app.gt.flush()
        last_steps = app.log_decode(last_steps)


async def _serve(app, loop, server, stop, force, load_time: float) -> None:
    """Start up, serve until the first stop signal, drain unless forced, then close."""
    st = loop.create_task(_startup(app, loop, load_time))
    fl = loop.create_task(_flusher(app))
    await stop
    app.draining = True
    st.cancel()
    if app._active and os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() not in ("1", "true", "yes"):
        log.info(f"Gracefully exiting... Remaining number of requests {len(app._active)}.")
        while app._active and not force.done():  # bounded: every request has a token budget
            await asyncio.wait([force], timeout=0.05)
    server.close()
    fl.cancel()
    await app.engine.stop()
