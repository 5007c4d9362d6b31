"""pyarrow imports pandas at its first conversion of Python objects unless it is hidden then (results/records.py):
a Locust process or a CLI command that builds a records table never pays pandas' import, and a user's code that
wants pandas still gets it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_records_tables_never_import_pandas_yet_pandas_still_works():
    code = textwrap.dedent(
        """\
        import sys
        from servesweep.results.records import COLUMNS, RecordBuffer
        buf = RecordBuffer()
        buf.add({**dict.fromkeys(COLUMNS), "request_id": "a", "point_id": "p", "worker": "w", "user": 0,
                 "warmup": False, "scheduled_ns": 1, "sent_ns": 1, "end_ns": 2, "target_prompt_tokens": 1,
                 "target_output_tokens": 1, "mono_to_wall_ns": 0, "chunk_ns": [1, 2], "response_text": "hi"})
        assert buf.table().num_rows == 1
        print("pandas after tables:", "pandas" in sys.modules)
        import pandas
        import pyarrow as pa
        print("to_pandas rows:", len(pa.table({"x": [1, 2]}).to_pandas()))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pandas after tables: False" in r.stdout, r.stdout
    assert "to_pandas rows: 2" in r.stdout, r.stdout
