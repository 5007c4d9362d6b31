"""servesweep.files: the one atomic writer. What a reader of a manifest or a summary relies on: the target holds the
old content or the whole new one, a failed write leaves the old file and no temp file, and permissions are as asked."""

import os
import stat

import pytest

from servesweep.files import atomic_path, write_atomic

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


def test_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "manifest.json"
    write_atomic(p, "old")
    write_atomic(p, b"new" * 1000, durable=False)
    assert p.read_bytes() == b"new" * 1000
    assert sorted(x.name for x in p.parent.iterdir()) == ["manifest.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "summary.json"
    write_atomic(p, "old")
    with pytest.raises(RuntimeError), atomic_path(p) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["summary.json"]


def test_mode_for_files_meant_for_others(tmp_path):
    old = os.umask(0o022)
    try:
        private = write_atomic(tmp_path / "a", "x")
        shared = write_atomic(tmp_path / "b", "x", mode=0o666)
    finally:
        os.umask(old)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
