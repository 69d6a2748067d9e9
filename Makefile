# Two entry points, both self-contained on a machine with only Python 3.11:
#   make demo   create/reuse .venv, install seqmem, run the main job and the quick benchmarks
#   make test   create/reuse .venv, install seqmem[dev], run the tests
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test clean

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
	$(BIN)/python -m models.resnet.benchmark --quick --out demo-output/resnet
	$(BIN)/python -m models.nmt.benchmark --quick --out demo-output/nmt

test: $(STAMP_DEV)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo-output
