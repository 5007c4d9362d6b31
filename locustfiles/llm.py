"""Streaming LLM load for Locust's own UI or headless runs.

    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --prompt-tokens 30000 --output-tokens 256
    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --headless -u 8 -t 2m -s 600 --records r.parquet \
        --slo 'ttft_p99<=2s'

    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --workload agent --session-turns 8 \
        --tool-result-tokens 2000 --think-time 2 --thinking off

Options (all in the web UI's start form): --model, --endpoint chat|completions|generate, --prompt-tokens,
--output-tokens, --output-dist, --no-ignore-eos, --no-cache-bust, --seed, --tokenizer, --max-requests, --warmup,
--api-key-env, --first-token-timeout, --stall-timeout, --total-timeout, --slo (a breach exits 1), --workload
synthetic|shared_prefix|dataset|agent, --shared-prefix-tokens, --num-groups, --dataset, --thinking on|off,
--session-turns, --tool-result-tokens, --think-time, --context-cap (docs/workloads.md); --records (at the end).
Workers (--worker) need no --host: the master sends it. Always give -s/--stop-timeout in headless runs with -t, so
streams still running at the end are measured instead of dropped.
"""

from servesweep import webui  # noqa: F401, E402  (live LLM tabs, --load-shape step-ramp, per-step CSV, /metrics)
from servesweep.locustfile import LLMUser  # noqa: F401  (Locust picks up the user class from this module)
