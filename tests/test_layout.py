"""The package's layout rules (pyproject.toml, [tool.importlinter]): which folder may import which, nothing outside
client/ imports Locust or gevent, sim/ stands alone, no import circles. A change that breaks one fails here with
import-linter's own report of the offending import chain."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_architecture_doc_lists_every_module():
    """docs/architecture.md's table of folders names every module of its folder (issue 29: 22 were missing), so
    a newcomer finds each one from the map; a module added without its line fails here with its path."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for line in doc.splitlines():
        m = re.match(r"\|\s*`([a-z_]+)/`\s*\|", line)
        if m:
            rows[m.group(1)] = line
    missing = []
    for f in sorted((ROOT / "src" / "servesweep").rglob("*.py")):
        rel = f.relative_to(ROOT / "src" / "servesweep")
        if f.name in ("__init__.py", "__main__.py") or "stand_in" in rel.parts:
            continue
        text = rows.get(rel.parts[0], "") if len(rel.parts) > 1 else doc
        if not re.search(rf"(?<![\w.]){re.escape(f.stem)}(\.py)?(?!\w)", text):
            missing.append(str(rel))
    assert not missing, f"modules docs/architecture.md does not name in their folder's row: {missing}"


def test_module_names_say_one_thing():
    """No two modules share a basename (issue 29: `answers.py` ×3, `live.py` ×3, `search.py` ×2, ... named different
    things), except where the folder says the role: `cli/<command>.py` is the command of that name and
    `observe/dashboards/<dashboard>.py` builds that dashboard."""
    by_name: dict[str, list[str]] = {}
    for f in sorted((ROOT / "src" / "servesweep").rglob("*.py")):
        rel = f.relative_to(ROOT / "src" / "servesweep")
        if f.name in ("__init__.py", "__main__.py") or rel.parts[0] == "cli" or rel.parts[:2] == ("observe", "dashboards"):
            continue
        by_name.setdefault(f.stem, []).append(str(rel))
    shared = {n: paths for n, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules sharing a name: {shared}"
