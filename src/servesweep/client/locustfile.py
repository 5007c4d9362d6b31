"""The locustfile of servesweep's runs: `locust -f <this file> --point-json ...` (what `run_point` starts; the
command: driver/command.py), or by hand with the knobs' options. locustfiles/llm.py, what people run, is the same
with the web UI module (client/webui.py) instead of this file: a process loads one of the two.

Importing it installs servesweep's listeners on Locust's events (client/plugin.py: the state of the process, made
once at init, and the modules each concern lives in) and gives Locust the user class. Under distributed Locust,
workers ship their records to the master with each report.
"""

from __future__ import annotations

from servesweep.client.plugin import install
from servesweep.client.user import LLMUser

__all__ = ["LLMUser"]

install(ui_module=False)
