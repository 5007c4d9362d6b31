"""Streaming LLM load for Locust's own UI or headless runs.

    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --prompt-tokens 30000 --output-tokens 256
    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --headless -u 8 -t 2m -s 600 --records r.parquet \
        --slo 'ttft_p99<=2s'

    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --workload agent --session-turns 8 \
        --tool-result-tokens 2000 --think-time 2 --thinking off

Options: the ramp (--load-shape, --ramp-steps, --ramp-hold, --ramp-spawn-rate) and every knob of a load point, the
same names and defaults as `servesweep load` (`servesweep load --help` lists them by group: load shape, prompt &
output, workload, timeouts, advanced; durations here in seconds), all in the web UI's start form in that order, with
--slo (a breach exits 1); --records (at the end). The user count is Locust's -u, the run time its -t.
Workers (--worker) need no --host: the master sends it.

    python locustfiles/llm.py --help     # Locust's options, then servesweep's, by group

is `locust -f locustfiles/llm.py --help` with servesweep's options listed too: Locust answers --help before it imports
the locustfile (locust issue 2917), so `locust -f ... --help` lists Locust's own options only. Any other arguments
run Locust with this file as `locust -f` does.

Headless without -s/--stop-timeout, the streams still running at -t get the point's stop timeout to finish (min(total,
first-token + 4 x stall + 60 s): 1440 s with the defaults; each stream stays bounded by its own timeouts) and are
measured, not dropped; an explicit -s (even 0) is kept. A master with -t ends like a servesweep duration point (its
workers finish their streams and ship every record first). Exit codes (docs/reports.md, "Exit codes"): 3 when no
measured request succeeded (it says why, and with 0 records why there are none) or when the failed share is above
--max-failure-rate (default 1%, 100% turns the share check off; it replaces Locust's --exit-code-on-error rule); a
failure within it is a WARNING line and exit 0; 1 an SLO breach. A process servesweep started (--point-json) stops within about a
second, exit 4, when its parent dies, and so do the workers Locust's --processes forked when their master dies.
"""

from servesweep.client import webui  # noqa: F401  (servesweep with the live_stats LLM tabs, step ramps, per-step CSV, /metrics)
from servesweep.client.user import LLMUser  # noqa: F401  (Locust picks up the user class from this module)

if __name__ == "__main__":
    # Run as a script: the imports above registered servesweep's options, so Locust's --help lists them.
    import sys

    from locust.main import main

    sys.argv = ["locust", "-f", __file__, *sys.argv[1:]]
    main()
