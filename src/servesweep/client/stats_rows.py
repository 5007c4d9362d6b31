"""Locust's own statistics with servesweep's LLM rows. client/user.py fires an `LLM TTFT` and an `LLM E2E` event
per successful request, so Locust's Statistics tab, CSV and HTML report show those latencies as rows of their own.
They are not requests: here they stay out of the Aggregated row, whose count, RPS, failures and response times are
the real requests' only. Every Locust process loads the locustfile, which installs this (the workers' totals are
what the master merges)."""

from __future__ import annotations

import locust.stats

PSEUDO_TYPE = "LLM"  # request_type of the rows that are measurements, not requests
_log_request = locust.stats.RequestStats.log_request


def _log_request_real_only(self, method, name, response_time, content_length) -> None:
    if method == PSEUDO_TYPE:
        self.entries[(name, method)].log(response_time, content_length)
        return
    _log_request(self, method, name, response_time, content_length)


def install() -> None:
    locust.stats.RequestStats.log_request = _log_request_real_only
