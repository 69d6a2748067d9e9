# Two entry points, both self-contained on a machine with only Python (3.9-3.11):
#   make demo    create/reuse .venv, install seqmem, run the main job (a few minutes)
#   make test    create/reuse .venv, install seqmem[dev], run every test (7 to 12 minutes on 2 cores, by the machine)
#   make check   the fast tier: no emulated-device processes, no training runs (about 3 minutes)
PYTHON ?= $(shell command -v python3.11 || command -v python3.10 || command -v python3.9 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/seqmem demo --out demo-output

# The tests that measure nothing (the fast tier and the slow training runs) run on two workers; those that
# measure the emulated device run one at a time, alone on the machine, as measurements must.
test: $(STAMP_DEV)
	$(BIN)/python -m pytest -q -n 2 -m "not device"
	$(BIN)/python -m pytest -q -m device

check: $(STAMP_DEV)
	$(BIN)/python -m pytest -q -n 2 -m "not device and not slow"

clean:
	rm -rf $(VENV) demo-output
