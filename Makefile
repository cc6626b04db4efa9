# Two commands for a fresh machine (both idempotent; a second call reuses the environment):
#   make run    set up .venv and run the main job (flexigpt run --cores all = snakemake that
#               clears a stale lock and reruns cut jobs; config/config.yaml)
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
BIN := $(VENV)/bin
CHECKED := flexigpt baselines workflow/scripts benchmarks tests

.PHONY: setup run smoke test check test-slow test-slurm lint report
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and exactly pinned: an unpinned resolve can pull a multi-GB CUDA build
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $@

run: setup
	. $(BIN)/activate && flexigpt run --cores all

smoke: setup
	. $(BIN)/activate && flexigpt run --cores all --configfile config/smoke.yaml

# lint and types first (a minute), then the suite; the layer contract is tests/test_import_contract.py
test: setup
	. $(BIN)/activate && ruff check $(CHECKED) && mypy && python -m pytest -q -n auto --dist loadfile -m "not slow and not gpu"

check: setup
	. $(BIN)/activate && ruff check $(CHECKED) && mypy && lint-imports && python -m flexigpt.core.import_contract

# the end-to-end smoke DAG and the real SmolLM2 resource build (minutes; in temporary dirs)
test-slow: setup
	. $(BIN)/activate && python -m pytest -q -m slow

# the smoke DAG through the real SLURM executor on a private single-node cluster (root,
# Debian 12: installs slurm-wlm, munge and MariaDB; tests/slurm/NOTES.md)
test-slurm: setup
	. $(BIN)/activate && pip install -q -e ".[slurm]" && bash tests/slurm/run_smoke.sh

lint: setup
	. $(BIN)/activate && snakemake --lint

report: setup
	. $(BIN)/activate && snakemake --cores 1 --report results/smollm2-135m/report.html
