# Two commands on a fresh machine:  `make quickstart`  and  `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: quickstart test test-extended test-fast install bench gpu-check gpu-wheels wheelhouse install-offline gguf

$(BIN)/llmtui: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'  # the build below uses it (no isolation)
	# not --quiet: pip's own progress (each download's bar, each build) shows while it works
	$(BIN)/pip install torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install --no-build-isolation -e '.[test]'
	# bytecode of the editable package, as a wheel install has it (the TUI starts ~0.1 s sooner)
	$(BIN)/python -m compileall -q tuiapp
	# DeepSpeed's CPU comm op, built once here (with a clock) so the first run does not
	$(BIN)/python tools/build_ops.py
	touch $(BIN)/llmtui

install: $(BIN)/llmtui

quickstart: install
	$(BIN)/llmtui run recipes/quickstart.toml

# Every tier, slow tests (real DeepSpeed ranks) included, in a random order (pytest-randomly prints
# the seed; rerun one order with --randomly-seed=N). `pytest` alone runs the fast tier only.
# llama-cpp-python (the GGUF export's parity check) compiles llama.cpp: tools/gguf_setup.py builds it at
# the lowest priority while the other tests run (cached in $LLMTUI_CACHE/gguf after), installs it, and
# the GGUF tests run last. The 25 slowest tests are listed at the end (the tier is to stay under 30 min).
test: install
	@date +%s > $(VENV)/.test-started
	$(BIN)/python tools/gguf_setup.py start
	$(BIN)/python -m pytest -q --durations=25 -m "(slow or not slow) and not gguf and not extended"
	$(BIN)/python tools/gguf_setup.py wait
	$(BIN)/python -m pytest -q -m gguf
	@echo "make test: the tests took $$(( ($$(date +%s) - $$(cat $(VENV)/.test-started)) / 60 )) min"

# llama-cpp-python and llama.cpp's converter, for `llmtui export --gguf` (tools/gguf_setup.py)
gguf: install
	$(BIN)/python tools/gguf_setup.py install

# The long end-to-end tests kept out of `make test` for time (marked extended): the dry step's families,
# kills at each resume edge, two runs sharing a cache entry, hostile serve requests, sequence parallelism,
# the tiny-agent chain (SFT, SFT, tool-using GRPO: ~7 min).
test-extended: install
	$(BIN)/python -m pytest -q --durations=10 -m extended

test-fast: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/run.py

# The GPU acceptance check (bench/gpu_check.py, docs/gpu.md): every GPU path through `llmtui run`,
# writes bench/GPU_RESULTS.md; without CUDA it says nothing ran and exits 0. ARGS='--cpu-smoke' on CPU.
gpu-check: install
	$(BIN)/python bench/gpu_check.py $(ARGS)

# The GPU check's optional packages (liger-kernel, torchao, bitsandbytes while under 60 MiB) as wheels in
# gpu-wheels/, for a GPU box without a package index: gpu_check installs them from there (docs/gpu.md).
# BASE=1: first what a box with only a CUDA torch lacks (transformers, DeepSpeed, ...): bench/gpu_box.sh runs it
GPU_PY ?= 3.12
gpu-wheels:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) tools/wheelhouse.py gpu gpu-wheels --python $(GPU_PY) $(if $(BASE),--base)

# Offline install (README "Offline install"): every wheel for a target into $(WHEELS), then on the
# server without an index: make install-offline WHEELS=DIR. PY/PLATFORM/EXTRAS/TORCH_INDEX pick the target.
WHEELS ?= wheelhouse
PY ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PLATFORM ?= manylinux_2_28_x86_64
EXTRAS ?=
TORCH_INDEX ?=
wheelhouse:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) tools/wheelhouse.py build $(WHEELS) --python $(PY) \
		--platform $(PLATFORM) $(if $(EXTRAS),--extras $(EXTRAS)) $(if $(TORCH_INDEX),--torch-index $(TORCH_INDEX))

install-offline:
	$(PYTHON) tools/wheelhouse.py install $(WHEELS) --venv $(VENV)
	touch $(BIN)/llmtui
