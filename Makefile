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

# Two pytest workers, one test file each at a time (files share fixtures and servers): the suite is mostly real
# processes waiting on each other, so two workers on two cores roughly halve the wall time.
test: $(STAMP) system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=30

clean:
	rm -rf $(VENV) runs .pytest_cache
