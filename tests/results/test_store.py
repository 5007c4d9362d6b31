"""Run folders are made in one place with one id format (results/store.py new_run): `servesweep run`'s and
`servesweep load`'s alike (issue 29 saw two places and two formats)."""

import re

import pytest

from servesweep.results.store import new_run

pytestmark = pytest.mark.fast


def test_one_id_format_and_no_two_runs_share_a_folder(tmp_path):
    ids = [new_run(tmp_path / "runs", "qwen-sweep")[0] for _ in range(3)]
    assert re.fullmatch(r"qwen-sweep-\d{8}-\d{6}", ids[0])
    # three runs in the same second: the second and third get -2, -3, never the first one's folder
    if ids[0] == ids[1][: len(ids[0])]:
        assert ids[1:] == [f"{ids[0]}-2", f"{ids[0]}-3"]
    assert len(set(ids)) == 3 and all((tmp_path / "runs" / i).is_dir() for i in ids)
