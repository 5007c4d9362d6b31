"""The package's layout rules (pyproject.toml, [tool.importlinter]): which folder may import which, nothing outside
client/ imports Locust or gevent, sim/ stands alone, no import circles. A change that breaks one fails here with
import-linter's own report of the offending import chain."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
