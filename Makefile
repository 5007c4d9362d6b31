# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every cache servesweep and its tests make lives here (prompt pools, SGLang's protocol code for the conformance
# tests, the real-SGLang environment): `make test-cold` points it at a new empty folder.
export SERVESWEEP_CACHE_DIR ?= $(CURDIR)/.cache
# Five pytest workers, one test file each at a time (files share fixtures and servers): the suite is mostly real
# processes waiting on each other (emulators streaming at real time, Ansible, Prometheus scrapes). Measured on this
# 2-core machine (2026-12-04, CPU sampled with vmstat): three workers left it 44% idle (15.5 min), five keep it
# busy (5% idle, 12 min). Tests assert no timing tails, so a busy machine makes them slower, never wrong.
PYTEST_WORKERS ?= 5

.PHONY: bytecode demo test test-fast test-cold test-deps lint system-deps sglang-cpu-env sglang-cpu clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip setuptools wheel
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

# The package's bytecode, written once: the suite starts about 500 Python processes that import servesweep (Locust,
# the emulator, the CLI; process accounting of one run) and, where PYTHONDONTWRITEBYTECODE is set, each would compile
# its modules again (0.07 s of CPU per Locust process). A source edited later is compiled again at import.
bytecode: $(STAMP)
	$(PY) -m compileall -q src

# Debian packages the tests need (real Prometheus, sshd, Chromium ...). Needs root; CI runs it via .ci/run.
system-deps:
	bash scripts/install-system-deps.sh

demo: $(STAMP)
	bash scripts/demo.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Real SGLang on this CPU: its own venv under $(SERVESWEEP_CACHE_DIR)/sglang-cpu (rebuilt when its pins change) and
# the tiny offline model (built once into the cache: an install step, not the real-SGLang tier's time).
sglang-cpu-env: $(STAMP)
	$(PY) -m servesweep.cli sglang-cpu install
	$(PY) -m servesweep.cli sglang-cpu model

# Start real SGLang on this machine's CPU with a tiny offline model (127.0.0.1:30000; Ctrl-C stops it).
sglang-cpu: sglang-cpu-env
	$(PY) -m servesweep.cli sglang-cpu serve

# Everything the tests need from outside, installed before pytest starts (so no two pytest workers ever install
# into the same folder at once): Debian packages, SGLang's protocol code per version, the real-SGLang environment.
test-deps: $(STAMP) system-deps sglang-cpu-env
	$(PY) tests/sim/sglang_reference.py --install

# The whole suite: what CI runs. Three sessions: the package's tests on pytest workers; then the real-SGLang tier
# (tests/sglang_cpu) in one process, so its servers (~3.6 GB each, at most three at once) are shared between its files
# and do not compete with the rest, and beside it the in-Locust session (tests/inlocust, gevent allowed; 40 s that
# mostly wait on short real-time runs, while the tier mostly waits on SGLang: 3.6 min idle, cold run 2026-12-04).
test: test-deps bytecode
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 --ignore=tests/sglang_cpu
	@log=$$(mktemp); \
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/inlocust > $$log 2>&1 & inlocust=$$!; \
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=15 tests/sglang_cpu; tier=$$?; \
	wait $$inlocust; rc=$$?; echo "--- tests/inlocust, run beside the real-SGLang tier:"; cat $$log; rm -f $$log; \
	exit $$(( tier != 0 ? tier : rc ))

# Under a minute, no process started (tests/conftest.py refuses them): pure functions, schemas, parsers, planners,
# and the locustfile's logic driven in-process.
# The two sessions run side by side (the in-Locust one mostly waits on its short real-time runs); its output follows.
test-fast: $(STAMP) bytecode
	@log=$$(mktemp); \
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not slow" tests/inlocust > $$log 2>&1 & inlocust=$$!; \
	SERVESWEEP_TEST_TIER=fast $(VENV)/bin/pytest -q -p no:cacheprovider -m fast; fast=$$?; \
	wait $$inlocust; rc=$$?; echo "--- tests/inlocust, run beside it:"; cat $$log; rm -f $$log; \
	exit $$(( fast != 0 ? fast : rc ))

# `make test` on a fresh clone of HEAD with every cache the suite makes pointed at a new empty folder (HOME, TMPDIR,
# XDG and pip caches, SERVESWEEP_CACHE_DIR): run it before each submission; what a warm machine hides shows here.
test-cold:
	bash scripts/test-cold.sh

clean:
	rm -rf $(VENV) runs .pytest_cache .cache
