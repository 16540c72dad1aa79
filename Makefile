# Two commands on a fresh machine:  `make quickstart`  and  `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: quickstart test install bench

$(BIN)/llmtui: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-build-isolation -e '.[test]'
	touch $(BIN)/llmtui

install: $(BIN)/llmtui

quickstart: install
	$(BIN)/llmtui run recipes/quickstart.toml

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/run.py
