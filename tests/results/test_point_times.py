"""A point's measured time to 0.1 s (issue 34, item 5): the manifest's stamps have milliseconds, so a 2.6 s point
reads 2.6 s in the report (whole-second stamps gave 2.0 s, and estimate/actual ratios off by up to 40%)."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from servesweep.results.manifest import now_iso
from servesweep.results.report import fmt_s
from servesweep.results.runfolder import _matrix_points, secs_between

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


def test_stamps_have_milliseconds():
    a = now_iso()
    time.sleep(0.25)
    b = now_iso()
    assert datetime.fromisoformat(a).microsecond % 1000 == 0 and "." in a
    assert 0.2 <= secs_between(a, b) < 1.0


def test_a_short_point_reads_its_time_to_a_tenth(tmp_path):
    raw = {
        "p1": {
            "status": "failed",
            "config_id": "s01",
            "started": "2026-12-03T10:00:00.100+00:00",
            "finished": "2026-12-03T10:00:02.700+00:00",
            "est_s": 2.0,
        }
    }
    (p,) = _matrix_points(tmp_path, raw)
    assert p.actual_s == pytest.approx(2.6)
    assert fmt_s(p.actual_s) == "2.6 s"
    # a manifest written before, with whole-second stamps, still reads
    raw["p1"].update(started="2026-12-03T10:00:00+00:00", finished="2026-12-03T10:00:03+00:00")
    assert _matrix_points(tmp_path, raw)[0].actual_s == 3.0
