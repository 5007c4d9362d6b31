"""The small packed experiment the packed-run tests share: 3 TP sizes x 2 memory fractions on the emulator, 8
declared GPUs on this machine, points of a few short requests."""

EXPERIMENT = {
    "name": "packed",
    "sglang_version": "0.5.23",
    "target": {"inventory": "local", "host_group": "gpu", "port": 0},
    "model": {"path": "Qwen/Qwen3.6-27B"},
    "launcher": {
        "kind": "process",
        "emulator": True,
        "gpu": "H200",
        "gpus_per_host": 8,
        "startup_timeout_s": 120,
        "sim_args": {"sim_load_time": 0.3, "sim_calibration": "speedup=20"},
    },
    "server": {
        "base": {"context_length": 8192, "max_running_requests": 16},
        "axes": {"tp_size": [1, 4, 8], "mem_fraction_static": [0.8, 0.85]},
    },
    "load": {
        "workload": "chat",
        "concurrency": [1, 2],
        "prompt_tokens": [256],
        "output_tokens": 8,
        "requests": 2,
        "warmup_s": 0,
    },
}
