# make demo | make test | make bench  -- each target sets up .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_CPU := torch==2.13.0
EXTRAS := dev,flint,notebooks,train,dask

.PHONY: setup demo test bench figures findings tune lint clean

setup: $(STAMP)

# Re-run the install whenever pyproject.toml changes. Torch goes in first, CPU build, when absent:
# a bare `torch` requirement would otherwise pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_CPU)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

DEMO_RUN := runs/demo

demo: $(STAMP)
	$(VENV)/bin/matroots sweep experiments/configs/demo.toml --out $(DEMO_RUN) --resume
	$(VENV)/bin/matroots report $(DEMO_RUN)
	$(VENV)/bin/matroots plot $(DEMO_RUN)
	@echo "table: $(DEMO_RUN)/report.txt and $(DEMO_RUN)/best_solver.csv; rows: $(DEMO_RUN)/results.parquet; figures: $(DEMO_RUN)/figures/"

# The suite runs on TEST_JOBS processes (pytest-xdist): one per core, at most 4; `make test TEST_JOBS=0`
# runs it in one process. --dist loadgroup: the tests of a file that share a module (or wider) fixture
# stay on one process, so it is built once; the others are spread one by one (tests/conftest.py, which
# also gives each process its share of the cores as torch threads).
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(min(4, os.cpu_count() or 1))")

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup tests

bench: $(STAMP)
	$(PY) experiments/bench_solvers.py --quick

# Small default (1.9 CPU-minutes; experiments/time_claims.py); `make figures FULL=1` draws the full set from the
# shipped results/ (minutes; `python paper_figs/figures.py --full --recompute` reruns the study: hours).
figures: $(STAMP)
	$(PY) paper_figs/figures.py $(if $(FULL),--full,)

# docs/findings.md's and docs/validation.md's generated blocks from the shipped results/ (seconds);
# after reshipping a study or the validation.
findings: $(STAMP)
	$(PY) paper_figs/findings.py --write
	$(PY) paper_figs/validation_findings.py --write

# Regenerate the shipped CPU selection table of method="auto" (matroots/data/selection_cpu.csv + .json)
# from its config; resumable (runs/tune_default), about 15 minutes of CPU on 2 cores.
tune: $(STAMP)
	$(VENV)/bin/matroots tune experiments/configs/tune_default.toml --out runs/tune_default --resume --install

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
