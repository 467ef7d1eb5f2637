#!/usr/bin/env bash
# One device call on a lent GPU machine: build there, then run the named phases in order, each under
# its own time limit, writing every log into LOGDIR and a one-line status per phase to
# LOGDIR/summary.txt (printed at the end). Phases:
#   build        setup-deps (offline: carry .deps/wheels and .deps/googletest) + configure + build
#   cpu          ctest -L cpu
#   moe-tests    the MoE kernel GPU tests (tests/moe)
#   layer-tests  the MoELayer GPU tests (tests/layer), W = 1, 2, 4
#   gpu-suite    ctest -L gpu (what `make test` runs), with per-test times
#   python       the Python suite
#   stress       ctest -L stress
#   moe-bench    epkit-moe kernels (full grid) + the torch baselines into bench/results/moe-h200-latest.json
#   moe-quick    epkit-moe kernels --quick
#   py-moe       the Python MoE tests alone (python/tests/test_moe.py)
#   gemm-packed  (issue #18) epkit-moe kernels, grouped GEMM only, G 8 and 32: masked against packed rows
#   stress-packed (issue #18) the packed-layout stress tests (ctest -L stress -R layout_packed)
#   layer-bench  epkit-moe layer into bench/results/moe-layer-h200-latest.json
#   comm-w1      epkit-bench at W = 1, both layouts, into bench/results/h200-w1-latest.json
#   w1-stages    (issue #15) a -DEPKIT_STAGE_TIMERS=ON build of epkit-bench in build-stages; block 0's
#                stage stamps of the local kernels at W = 1, decode and decode-v2lite, 1 and 128 tokens
#   w1-ncu       (issue #15) the profiler's own kernel times (gpu__time_duration) of the local
#                dispatch / combine kernels at 1 and 128 tokens, against the event-timed figures
#                (NCU_CACHE=none: warm caches, as in the benchmark; default all: flushed before each)
#   comm-x2      (2 GPUs, issue #17) epkit-bench at EP2 with the baselines, both layouts, + weights at dispatch
#   layer-x2     (2 GPUs, issue #17) epkit-moe layer at EP2, 128 local experts per rank
# Usage: scripts/gpu-session.sh LOGDIR PHASE... ; env BUILD (default build-gpu), PHASE_TIMEOUT (s).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: scripts/gpu-session.sh LOGDIR PHASE...}
shift
mkdir -p "$LOG"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
BUILD=${BUILD:-build-gpu}
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
mkdir -p bench/results

phase() {  # phase NAME TIMEOUT COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c "$*" > "$LOG/$name.log" 2>&1
  local rc=$? t=$(( $(date +%s) - t0 ))
  printf '%-12s rc=%-3s %4ss\n' "$name" "$rc" "$t" | tee -a "$SUMMARY"
  tail -n "${TAIL:-15}" "$LOG/$name.log"
  return 0
}

for p in "$@"; do
  case "$p" in
    build)
      { date -u; nvidia-smi; } > "$LOG/machine.txt" 2>&1
      phase build "${PHASE_TIMEOUT:-420}" "bash scripts/setup-deps.sh && \
        cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release \$(python3 -c 'import nanobind' >/dev/null 2>&1 && echo -DEPKIT_BUILD_PYTHON=ON) && \
        time cmake --build $BUILD -j \$(nproc)" ;;
    cpu) phase cpu 120 "cd $BUILD && ctest -L cpu --output-on-failure" ;;
    moe-tests) phase moe-tests "${PHASE_TIMEOUT:-300}" "cd $BUILD && ctest -R '^moe_test_' -L gpu --output-on-failure --timeout 240" ;;
    layer-tests) phase layer-tests "${PHASE_TIMEOUT:-420}" "cd $BUILD && ctest -R '^test_moe_layer' -L gpu --output-on-failure --timeout 300" ;;
    gpu-suite) phase gpu-suite "${PHASE_TIMEOUT:-540}" "cd $BUILD && time ctest -L gpu -j ${EPKIT_TEST_JOBS:-8} --output-on-failure --timeout 300" ;;
    make-test) phase make-test "${PHASE_TIMEOUT:-540}" "time bash scripts/run-tests.sh $BUILD" ;;
    python) phase python "${PHASE_TIMEOUT:-300}" "time bash scripts/run-python-tests.sh $BUILD" ;;
    stress) phase stress "${PHASE_TIMEOUT:-560}" "cd $BUILD && time ctest -L stress --output-on-failure" ;;
    py-moe) phase py-moe "${PHASE_TIMEOUT:-300}" "time bash scripts/run-python-tests.sh $BUILD -k 'test_moe'" ;;
    gemm-packed) phase gemm-packed "${PHASE_TIMEOUT:-300}" "$BUILD/bin/epkit-moe kernels --kernels grouped_gemm --groups 8,32 --m 16,64,256,1024,4096 --json $LOG/gemm-packed.json" ;;
    stress-packed) phase stress-packed "${PHASE_TIMEOUT:-300}" "cd $BUILD && time ctest -L stress -R layout_packed -j 8 --output-on-failure" ;;
    moe-quick) phase moe-quick "${PHASE_TIMEOUT:-300}" "$BUILD/bin/epkit-moe kernels --quick --groups 16,32 --m 8,32,64,1024 --json $LOG/moe-quick.json" ;;
    moe-bench) phase moe-bench "${PHASE_TIMEOUT:-540}" "$BUILD/bin/epkit-moe kernels --json bench/results/moe-h200-latest.json && \
        python3 tools/epkit-moe/torch_baselines.py bench/results/moe-h200-latest.json && cp bench/results/moe-h200-latest.json $LOG/" ;;
    layer-bench) phase layer-bench "${PHASE_TIMEOUT:-540}" "$BUILD/bin/epkit-moe layer --json bench/results/moe-layer-h200-latest.json && \
        cp bench/results/moe-layer-h200-latest.json $LOG/" ;;
    comm-w1) phase comm-w1 "${PHASE_TIMEOUT:-300}" "$BUILD/bin/epkit-run -n 1 -- $BUILD/bin/epkit-bench --preset decode,decode-v2lite,prefill --layout masked,packed --json bench/results/h200-w1-latest.json && \
        cp bench/results/h200-w1-latest.json $LOG/" ;;
    w1-stages) phase w1-stages "${PHASE_TIMEOUT:-240}" "cmake -S . -B build-stages -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPKIT_STAGE_TIMERS=ON >/dev/null && \
        cmake --build build-stages -j \$(nproc) --target epkit-bench epkit-run >/dev/null && \
        build-stages/bin/epkit-run -n 1 -- build-stages/bin/epkit-bench --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers" ;;
    w1-ncu) phase w1-ncu "${PHASE_TIMEOUT:-180}" "for t in 1 128; do ncu --clock-control none --cache-control ${NCU_CACHE:-all} --target-processes all --kernel-name regex:local_ \
        --launch-skip 400 --launch-count 12 --metrics gpu__time_duration.sum,sm__cycles_active.max,smsp__warps_launched.sum \
        $BUILD/bin/epkit-run -n 1 -- $BUILD/bin/epkit-bench --preset decode --tokens \$t --no-baselines 2>&1 | grep -E 'local_|gpu__time|cycles_active|warps_launched|total_us|epkit  ' ; done" ;;
    comm-x2) phase comm-x2 "${PHASE_TIMEOUT:-420}" "$BUILD/bin/epkit-run -n 2 -- $BUILD/bin/epkit-bench --preset decode,decode-v2lite,prefill --layout masked,packed --json bench/results/h200x2-latest.json && \
        $BUILD/bin/epkit-run -n 2 -- $BUILD/bin/epkit-bench --preset decode --weights-at-dispatch --no-baselines --json $LOG/h200x2-wad.json && \
        cp bench/results/h200x2-latest.json $LOG/" ;;
    layer-x2) phase layer-x2 "${PHASE_TIMEOUT:-540}" "$BUILD/bin/epkit-run -n 2 -- $BUILD/bin/epkit-moe layer --experts 128 --json bench/results/moe-layer-h200x2-latest.json && \
        cp bench/results/moe-layer-h200x2-latest.json $LOG/" ;;
    *) echo "unknown phase $p" | tee -a "$SUMMARY" ;;
  esac
done
echo "=== summary"
cat "$SUMMARY"
# One archive of every log and result (a device call returns at most 8 files).
tar czf "$LOG.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")" && rm -rf "$LOG"
