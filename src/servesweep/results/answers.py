"""Moved to results/answer_checks.py (issue 29: one module name, one concept). This re-export keeps the importers
the lead patches (results/needle.py, results/degeneration.py, matrix/answer_probes.py) working until they import
answer_checks; delete it with them."""

from servesweep.results.answer_checks import *  # noqa: F403
from servesweep.results.answer_checks import answer_mismatch_rate, degenerate, score_needle  # noqa: F401
