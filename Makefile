# Two commands on a fresh machine:  `make quickstart`  and  `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: quickstart test test-fast install bench

$(BIN)/llmtui: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-build-isolation -e '.[test]'
	# bytecode of the editable package, as a wheel install has it (the TUI starts ~0.1 s sooner)
	$(BIN)/python -m compileall -q tuiapp
	touch $(BIN)/llmtui

install: $(BIN)/llmtui

quickstart: install
	$(BIN)/llmtui run recipes/quickstart.toml

# Every tier, slow tests (real DeepSpeed ranks) included, in a random order (pytest-randomly prints
# the seed; rerun one order with --randomly-seed=N). `pytest` alone runs the fast tier only.
test: install
	$(BIN)/python -m pytest -q -m "slow or not slow"

test-fast: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/run.py
