# ratchet — two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUNS   ?= runs
TORCH  ?= 2.13.0

.PHONY: demo test install dev benchmarks clean

$(BIN)/ratchet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH)  # before anything that depends on torch (a CPU build, not 5 GB of CUDA)
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $@

install: $(BIN)/ratchet

dev: install

## demo: refine Gymnasium's LunarLander-v3 heuristic and write an HTML report
demo: install
	$(BIN)/ratchet run examples/lunar_lander --runs-dir $(RUNS) --run-id demo-$$(date +%Y%m%d-%H%M%S)

## test: run the test suite (offline, a few minutes on 2 cores)
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile  # two processes: most tests wait on worker start-up, not CPU

benchmarks: install
	$(BIN)/python benchmarks/examples.py
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
