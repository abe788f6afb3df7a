# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/specdecode-tune: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first, so the `engine` extra does not pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[engine,dev]'
	touch $@

setup: $(BIN)/specdecode-tune

demo: setup
	$(BIN)/specdecode-tune demo

test: setup
	$(BIN)/python -m pytest -q
	$(BIN)/lint-imports

.PHONY: setup demo test
