"""The SGLang emulator: an SGLang-compatible HTTP server whose timing comes from a simulated GPU engine.

Run it with `servesweep sim ARGS` or `python -m servesweep.sim ARGS` (SGLang's `launch_server` flags plus
`--sim-*`); start it from Python with `servesweep.sim.launch.start_sim`.

Modules:
- `cli`: SGLang's flags for the emulated version (`--sim-sglang-version`), `--config` YAML, the click wrapper
- `server`: the endpoints (`SimApp`), batched `/generate`, start-up, drain on SIGTERM (`run_server`)
- `connection`: HTTP/1.1 over asyncio + httptools (keep-alive, chunked streams, TCP_NODELAY)
- `stream`: one request's engine callbacks turned into SSE chunks or a body (the per-chunk hot path)
- `protocol`: the exact bytes: chunk pieces, bodies, error texts
- `exposition`: `/metrics` (`sglang:*` names, types, labels, buckets) from plain counters; `gauges`, `events`: its
  unconditional gauges and the families an event sets
- `replies`: what the emulator answers (the needle stated, or a faulty reply); `answer_stream`, `choices` (n > 1),
  `logprobs`, `validation`: request bodies checked as SGLang checks them
- `faults`, `groundtruth`: fault injection, and the per-request record of what was written when
- `launch`: start and stop an emulator from Python; `deadline`, `power`, `engine_fit`
- `text`: single-token words for plausible output; `probe`: a small raw-socket client for tests and benchmarks
- `engine`: the discrete-event engine; its step-time model and accept lengths are `servesweep.sglang.stepmodel` and
  `servesweep.sglang.speculative` (the planner prices points with them without importing the emulator)
"""
