#!/usr/bin/env bash
# Builds epkit on a GPU machine, runs the GPU (and CPU) suites and a smoke benchmark, and writes
# every log into LOGDIR.  Usage: scripts/gpu-check.sh LOGDIR [--tests REGEX] [--stress] [--no-bench] [--bench ARGS...]
# The suites are those of `make test` (ctest labels cpu and gpu, pytest -m "not stress"), each timed,
# with every test's time in the summary; --stress adds `make stress`'s (label stress, -m stress).
# The build needs NVSHMEM (NVSHMEM_HOME or python3's nvidia.nvshmem) and GoogleTest sources in
# .deps/googletest (scripts/setup-deps.sh puts them there; carry that folder to a machine without apt).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: scripts/gpu-check.sh LOGDIR [--tests REGEX] [--stress] [--no-bench] [--bench ARGS...]}
shift
TESTS="" ; BENCH=1 ; STRESS=0 ; BENCH_ARGS=(--preset decode --tokens 1,128 --iters 200)
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) TESTS=$2; shift 2 ;;
    --stress) STRESS=1; shift ;;
    --no-bench) BENCH=0; shift ;;
    --bench) shift; BENCH_ARGS=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$LOG"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
BUILD=${EPKIT_BUILD_DIR:-build-gpu}
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi; nvidia-smi topo -m; } > "$LOG/machine.txt" 2>&1
bash scripts/setup-deps.sh > "$LOG/deps.log" 2>&1 || { echo "deps failed"; tail "$LOG/deps.log"; exit 1; }
t0=$(date +%s)
PYARG=$(python3 -c "import nanobind" >/dev/null 2>&1 && echo -DEPKIT_BUILD_PYTHON=ON)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release $PYARG > "$LOG/build.log" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" >> "$LOG/build.log" 2>&1 || { echo "build failed"; tail -40 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
t_all=$(date +%s)
t0=$(date +%s)
( cd "$BUILD" && ctest -L cpu --output-on-failure ) > "$LOG/cpu-tests.log" 2>&1 || rc=1
echo "cpu suite: $(( $(date +%s) - t0 )) s"
tail -3 "$LOG/cpu-tests.log"
t0=$(date +%s)
( cd "$BUILD" && ctest -L gpu --output-on-failure ${CTEST_TIMEOUT:+--timeout "$CTEST_TIMEOUT"} ${TESTS:+-R "$TESTS"} ) > "$LOG/gpu-tests.log" 2>&1 || rc=1
echo "gpu suite: $(( $(date +%s) - t0 )) s"
grep -E "Test +#|tests passed|Failed|SKIP" "$LOG/gpu-tests.log" | tail -40
if [ "${PYTESTS:-1}" = 1 ]; then
  t0=$(date +%s)
  bash scripts/run-python-tests.sh "$BUILD" -m "not stress" > "$LOG/python-tests.log" 2>&1 || rc=1
  echo "python suite: $(( $(date +%s) - t0 )) s"
  sed -n '/slowest durations/,$p' "$LOG/python-tests.log" | grep -E " call | setup |passed|failed|skipped" | head -40
  tail -3 "$LOG/python-tests.log"
fi
echo "make test equivalent (cpu + gpu + python): $(( $(date +%s) - t_all )) s"
if [ "$STRESS" = 1 ]; then
  t0=$(date +%s)
  ( cd "$BUILD" && ctest -L stress --output-on-failure ${TESTS:+-R "$TESTS"} ) > "$LOG/stress-tests.log" 2>&1 || rc=1
  echo "stress suite: $(( $(date +%s) - t0 )) s"
  grep -E "Test +#|tests passed|Failed|SKIP" "$LOG/stress-tests.log" | tail -20
  if [ "${PYTESTS:-1}" = 1 ]; then
    t0=$(date +%s)
    bash scripts/run-python-tests.sh "$BUILD" -m stress > "$LOG/python-stress.log" 2>&1 || rc=1
    echo "python stress suite: $(( $(date +%s) - t0 )) s"
    sed -n '/slowest durations/,$p' "$LOG/python-stress.log" | grep -E " call |passed|failed" | head -20
  fi
fi
if [ "$BENCH" = 1 ] && [ -x "$BUILD/bin/epkit-bench" ]; then
  ngpu=$(nvidia-smi -L | grep -c '^GPU')
  "$BUILD/bin/epkit-run" -n "$ngpu" -- "$BUILD/bin/epkit-bench" "${BENCH_ARGS[@]}" --json "$LOG/bench.json" \
    > "$LOG/bench.log" 2>&1 || rc=1
  tail -30 "$LOG/bench.log"
fi
exit $rc
