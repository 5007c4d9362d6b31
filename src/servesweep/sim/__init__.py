"""The SGLang emulator: an SGLang-compatible HTTP server whose timing comes from a simulated GPU engine.

Run it with `servesweep sim ARGS` or `python -m servesweep.sim ARGS` (SGLang's `launch_server` flags plus
`--sim-*`); start it from Python with `servesweep.sim.launch.start_sim`.
"""
