# ratchet — two commands: `make demo` and `make test` (which runs `make lint` first).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUNS   ?= runs
TORCH  ?= 2.13.0

.PHONY: demo test lint install dev benchmarks docs docs-build clean

# a stamp written only once every install step has succeeded: an install cut short (Ctrl-C, a network error) is
# redone by the next make, never taken for a finished one because .venv/bin/ratchet already exists
STAMP  := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH)  # before anything that depends on torch (a CPU build, not 5 GB of CUDA)
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $@

install: $(STAMP)

dev: install

## demo: refine Gymnasium's LunarLander-v3 heuristic and write an HTML report
demo: install
	$(BIN)/ratchet run examples/lunar_lander --runs-dir $(RUNS) --run-id demo-$$(date +%Y%m%d-%H%M%S)

## lint: ruff's rule set (pyproject's [tool.ruff]) and mypy (its [tool.mypy]), the versions pinned in the dev extra
lint: install
	$(BIN)/ruff check src tests benchmarks examples scripts docs
	$(BIN)/mypy

## test: lint, then run the test suite (offline, about 12 minutes on 2 cores)
test: install lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile  # two processes: most tests wait on worker start-up, not CPU

## docs: serve the documentation site at http://127.0.0.1:8000 (rebuilds on every edit)
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

## docs-build: build the site into site/ in strict mode: a broken link or a missing reference fails (CI runs it)
docs-build: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

benchmarks: install
	$(BIN)/python benchmarks/examples.py
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache
