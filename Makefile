# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint system-deps clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip setuptools wheel
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

# Debian packages the tests need (real Prometheus, sshd, Chromium ...). Needs root; CI runs it via .ci/run.
system-deps:
	bash scripts/install-system-deps.sh

demo: $(STAMP)
	bash scripts/demo.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Three pytest workers, one test file each at a time (files share fixtures and servers): the suite is mostly real
# processes waiting on each other (emulators streaming at real time, Ansible over SSH, Prometheus scrapes), so three
# workers on two cores finish sooner than two; timing assertions stay robust to that load (docs: no timing tails).
test: $(STAMP) system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -n 3 --dist loadfile --durations=30

clean:
	rm -rf $(VENV) runs .pytest_cache
