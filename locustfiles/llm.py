"""Streaming LLM load for Locust's own UI or headless runs.

    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --prompt-tokens 30000 --output-tokens 256
    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --headless -u 8 -t 2m -s 600 --records r.parquet \
        --slo 'ttft_p99<=2s'

Options (shown in the UI under "servesweep"): --model, --endpoint, --prompt-tokens, --output-tokens,
--no-cache-bust, --seed, --tokenizer, --max-requests, --warmup, --api-key-env, --first-token-timeout,
--stall-timeout, --total-timeout, --records, --slo. Always give -s/--stop-timeout in headless runs with -t, so
streams still running at the end are measured instead of dropped.
"""

from servesweep import webui  # noqa: F401, E402  (live LLM tabs, --load-shape step-ramp, per-step CSV, /metrics)
from servesweep.locustfile import LLMUser  # noqa: F401  (Locust picks up the user class from this module)
