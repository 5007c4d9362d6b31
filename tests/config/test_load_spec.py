"""LoadPoint: the contract the orchestrator and `servesweep load` build points with. Errors name the field."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from servesweep.config.point import LoadPoint

BASE = {"base_url": "http://127.0.0.1:30000", "concurrency": 4, "prompt_tokens": 3000, "output_tokens": 64}


@pytest.mark.fast
def test_defaults_and_derived_values():
    p = LoadPoint(**BASE, requests=10)
    assert p.first_token_s == 900 and p.cache_bust and p.endpoint == "chat"
    assert p.id.startswith("c4-p3000-o64-chat-n10-")
    assert p.id == LoadPoint(**BASE, requests=10).id  # stable
    assert p.id != LoadPoint(**{**BASE, "seed": 1}, requests=10).id
    assert LoadPoint(**BASE, requests=10, point_id="mine").id == "mine"
    assert LoadPoint(**{**BASE, "base_url": "http://h:1/v1/"}, requests=1).base_url == "http://h:1"
    # a stop timeout long enough for a legitimate slow stream to end
    assert LoadPoint(**BASE, duration_s=5).effective_stop_timeout() >= 900


@pytest.mark.parametrize(
    "change, field",
    [
        ({"base_url": "127.0.0.1:30000"}, "base_url"),
        ({"concurrency": 0}, "concurrency"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"endpoint": "responses"}, "endpoint"),
        ({"api_key_env": "sk-abc123 secret"}, "api_key_env"),
        ({"headers": {"Authorization": "Bearer x"}}, "headers"),
        ({"extra_body": {"max_tokens": 5}}, "extra_body"),
        ({"point_id": "a/b"}, "point_id"),
        ({"first_token_s": -1}, "first_token_s"),
        ({"bogus": 1}, "bogus"),
    ],
)
@pytest.mark.fast
def test_bad_fields_are_named(change, field):
    with pytest.raises(ValidationError) as e:
        LoadPoint(**{**BASE, "requests": 5, **change})
    assert field in str(e.value)


@pytest.mark.fast
def test_a_point_needs_a_stop_rule():
    with pytest.raises(ValidationError, match="requests or duration_s"):
        LoadPoint(**BASE)


def test_orchestrator_side_imports_stay_unpatched():
    """loadspec, load, records, summary, results must not import Locust or gevent (the orchestrator imports them)."""
    code = (
        "import sys; import servesweep.config.point, servesweep.driver.load, servesweep.results.records, servesweep.results.summary, "
        "servesweep.results.store; bad=[m for m in ('locust','gevent') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
