# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
# The set-up is quiet: one line says what it does, and pip speaks only when something goes wrong
# (tests/test_packaging.py keeps the package's own build free of warnings).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check

# torch first, pinned; which build that is depends on where pip finds it. Stock PyPI on Linux has
# the CUDA build (several GB; it runs on CPU too). TORCH_INDEX, when set, is passed to pip as
# --extra-index-url: `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` gets the CPU-only
# build (a few hundred MB). Nothing probes an index by itself: CI cannot reach PyTorch's.
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
TORCH_BUILD := $(if $(TORCH_INDEX),torch 2.13.0 with $(TORCH_INDEX) as an extra index,torch 2.13.0 from PyPI (on Linux the CUDA build; TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build))

$(BIN)/specdecode-tune: pyproject.toml
	@echo "setting up $(VENV): $(TORCH_BUILD), then this package with its engine and dev extras (minutes the first time)"
	@$(PY) -m venv $(VENV)
	@$(PIP) --upgrade pip
	@$(PIP) $(TORCH_FROM) torch==2.13.0
	@$(PIP) -e '.[engine,dev]'
	@touch $@

setup: $(BIN)/specdecode-tune

# The tests also need the fleet extra (sglang-router's wheel, with its binary); the demo does not.
$(VENV)/.fleet-extra: $(BIN)/specdecode-tune
	@echo "adding the fleet extra (sglang-router) for the tests"
	@$(PIP) -e '.[engine,dev,fleet]'
	@touch $@

demo: setup
	$(BIN)/specdecode-tune demo

test: setup $(VENV)/.fleet-extra
	$(BIN)/python -m pytest -q
	$(BIN)/lint-imports --no-logo

.PHONY: setup demo test
