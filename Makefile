# Front door. `make bench` and `make test` are the two commands of the README's quick start.
BUILD ?= build
JOBS ?= $(shell nproc)
# The Python extension is built wherever nanobind imports (scripts/setup-deps.sh installs it).
CMAKE_ARGS ?= $(shell python3 -c "import nanobind" >/dev/null 2>&1 && echo -DEPKIT_BUILD_PYTHON=ON)
NGPUS := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# Ranks of `make bench`: one per GPU. More (make bench NRANKS=4) put several on a GPU: correct, but
# the timings then mean nothing (the table says so).
NRANKS ?= $(NGPUS)

.PHONY: all deps configure build test test-cpu test-gpu stress sanitize soak bench clean

all: build

deps:
	@bash scripts/setup-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Whole suite: CPU tests everywhere, GPU tests where GPUs exist (else a loud skip), Python where it can.
test: build
	@bash scripts/run-tests.sh $(BUILD)

# The long runs `make test` leaves out (ctest label stress, pytest marker stress): the 10,000-iteration
# stress test, world size 8 in full, the benchmark with full samples, the other fault scenarios, a
# one-minute soak per world size, the long Python fuzz. Needs a GPU; takes longer.
stress: build
	@bash scripts/run-tests.sh $(BUILD) --stress

# compute-sanitizer (memcheck, racecheck, synccheck) over reduced cases of every kernel family, on one
# GPU within SANITIZE_BUDGET_S (default 600 s): one summary line per tool, logs and summary.json in
# $(BUILD)/sanitize. A subset: make sanitize SANITIZE_TOOLS=racecheck SANITIZE_FAMILIES="gemm layer".
# What each family runs, and how racecheck's findings are classified: scripts/sanitize.sh.
SANITIZE_TOOLS ?= memcheck synccheck racecheck
sanitize: build
	@bash scripts/sanitize.sh $(BUILD) $(SANITIZE_TOOLS)

# The MoE layer forward after forward at world size 1 and 2 (two PEs on one GPU), SOAK_MINUTES in all
# (default 10), every SOAK_CHECK_EVERY-th output against the host reference; report in
# $(BUILD)/soak/report.json. make soak SOAK_MINUTES=60 for a long one.
SOAK_MINUTES ?= 10
SOAK_CHECK_EVERY ?= 8
soak: build
	@SOAK_MINUTES=$(SOAK_MINUTES) SOAK_CHECK_EVERY=$(SOAK_CHECK_EVERY) bash scripts/soak.sh $(BUILD)

test-cpu: build
	cd $(BUILD) && ctest -L cpu --output-on-failure

test-gpu: build
	cd $(BUILD) && ctest -L gpu --output-on-failure

# The main job: the dispatch/combine benchmark, one rank per local GPU. With one GPU that is world
# size 1, which crosses no link (local permutation only); the table's NOTE line says so. Then, where
# transformers imports, one MoE block of each family against transformers' experts implementations
# on GPU 0 (tools/epkit-moe/transformers_bench.py; TF_BENCH_ARGS="--quick" for a shorter run,
# "--json FILE" to keep it).
TF_BENCH_ARGS ?=
bench: build
	@if [ "$(NGPUS)" = "0" ] || [ -z "$(NGPUS)" ]; then \
	  echo "make bench: no GPU on this machine; nothing to benchmark (build is ready in $(BUILD)/)."; \
	else \
	  NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 $(BUILD)/bin/epkit-run -n $(NRANKS) -- $(BUILD)/bin/epkit-bench $(BENCH_ARGS) && \
	  if PYTHONPATH=$(BUILD)/python python3 -c "import torch, transformers, epkit.transformers" >/dev/null 2>&1; then \
	    PYTHONPATH=$(BUILD)/python python3 tools/epkit-moe/transformers_bench.py $(TF_BENCH_ARGS); \
	  else \
	    echo "make bench: skipped the MoE block against Hugging Face transformers (needs torch, transformers >= 5.17 and the Python extension: pip install '.[transformers]')"; \
	  fi; \
	fi

clean:
	rm -rf $(BUILD)
