# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
# The set-up is quiet: one line says what it does, and pip speaks only when something goes wrong
# (tests/test_packaging.py keeps the package's own build free of warnings).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check

# The CPU build of torch first, so the `engine` extra does not pull a multi-GB CUDA build.
$(BIN)/specdecode-tune: pyproject.toml
	@echo "setting up $(VENV): torch (CPU build), then this package with its engine and dev extras (minutes the first time)"
	@$(PY) -m venv $(VENV)
	@$(PIP) --upgrade pip
	@$(PIP) torch==2.13.0
	@$(PIP) -e '.[engine,dev]'
	@touch $@

setup: $(BIN)/specdecode-tune

demo: setup
	$(BIN)/specdecode-tune demo

test: setup
	$(BIN)/python -m pytest -q
	$(BIN)/lint-imports --no-logo

.PHONY: setup demo test
