# The README's two commands: `make demo` (whole workflow on the embedded default) and `make test`.
# Both create .venv with pip on first use; torch is pinned to the CPU wheel (constraints.txt).
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-llmrnn
RUNENV := PATH=$(CURDIR)/$(BIN):$$PATH OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

.PHONY: venv demo test test-e2e lint report clean-results

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(RUNENV) snakemake --profile profiles/local all
	$(RUNENV) snakemake --profile profiles/local --report report.html all

# `make test`: every unit and workflow test except the whole-workflow runs marked e2e (real SLURM, the
# rerun table's full run: ~34 min of the suite); `make test-e2e` runs those; .ci/run runs both.
test: $(STAMP) verl-envs
	$(RUNENV) pytest -x -q --timeout 3600 --durations 15 -m "not e2e" tests

test-e2e: $(STAMP) verl-envs
	$(RUNENV) pytest -x -q --timeout 3600 --durations 15 -m e2e tests

lint: $(STAMP)
	$(RUNENV) snakefmt --check Snakefile rules
	$(RUNENV) snakemake --lint
	$(RUNENV) ruff check src tests benchmarks

# Separate CPU venvs with verl 0.7.1 (reference) and 0.9.1 for tests/test_train_verl.py (~90 s each, cached
# by a stamp holding the build script's hash).
VERL_VERSIONS := 0.7.1 0.9.1
.PHONY: verl-envs
verl-envs: $(foreach v,$(VERL_VERSIONS),.venv-verl-$(v)/.llmrnn-verl-stamp)

.venv-verl-%/.llmrnn-verl-stamp: scripts/make_verl_env.sh
	bash scripts/make_verl_env.sh $*

clean-results:
	rm -rf results logs .snakemake report.html
