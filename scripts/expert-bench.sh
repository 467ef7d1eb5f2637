#!/usr/bin/env bash
# The expert compute's GPU run in phases, so that each run under a 10-minute limit does what
# fits: build, the GPU tests of the router / gate / layer, compute-sanitizer over the new
# kernels, the router and gate + router A/Bs, DeepGEMM against epkit, the layer A/B.
#
#   scripts/expert-bench.sh TAG PHASE...      (from the repository root; writes into $OUT, else /tmp/expert-bench)
#
# Phases, in the order given (a phase starts only if the run's budget, BUDGET_S = 560 s from the
# start, still holds its estimate; skipped phases are logged):
#   deps      scripts/setup-deps.sh (offline: from a copied .deps/wheels and .deps/googletest)
#   build     configure BUILD (build-gpu) once, then ninja the targets the phases run
#   test      ctest: moe_test_router, moe_test_gate, test_moe_layer (W = 1, single process, DeepSeek shapes)
#   sanitize  compute-sanitizer memcheck and racecheck over the warp router and GateRouter tests
#   router    epkit-moe kernels --kernels router,gate_router, both router kernels, 5 interleaved rounds
#   gemm      epkit-moe kernels --kernels grouped_gemm, G 8/16/32, m 1-128 (and the ceilings): gemm.json
#   dg-masked, dg-contiguous
#             deepgemm_baseline.py into gemm.json (this run's, else a router run for the ceilings, FP8 at 8192^3):
#             the masked cases (both shapes, G 8/16/32, m 1-128, even and uneven), or the contiguous
#             ones (G 8 m 512-4096, G 32 m 512). DeepGEMM's kernels are compiled first by 12
#             processes into BUILD/deepgemm-jit, which the next run on the same machine reuses.
#             The DeepGEMM wheel goes in .whl/; without it the script says so and goes on.
#   layer     epkit-moe layer: 256 and 32 experts, batches 1/32/128, q 1/2, schedule none (with the
#             fused gate + router on and off at <= 32 tokens)
#
# Results: $OUT/TAG.tgz (every log and JSON), $OUT/TAG-*.json (router, gemm, layer), $OUT/TAG-phases.txt.
#
# Two runs on one machine (the second reuses build-gpu and the DeepGEMM cache; on a fresh machine
# `build` runs again and the phases that no longer fit are skipped, for a third run):
#   scripts/expert-bench.sh c1 deps build router test sanitize
#   scripts/expert-bench.sh c2 deps build dg-masked dg-contiguous layer
# with carry [".deps/wheels", ".deps/googletest", ".whl"].
set -u
TAG=${1:?usage: scripts/expert-bench.sh TAG PHASE...}; shift
OUTDIR=${OUT:-/tmp/expert-bench}
BUILD=${BUILD:-build-gpu}
BUDGET=${BUDGET_S:-560}
T0=$(date +%s)
W=$(mktemp -d)/$TAG; mkdir -p "$W" "$OUTDIR"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
left() { echo $((BUDGET - ($(date +%s) - T0))); }
log() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$W/phases.txt"; }
finish() {
  cp "$W/phases.txt" "$OUTDIR/$TAG-phases.txt" 2>/dev/null
  for j in "$W"/*.json; do [ -f "$j" ] && cp "$j" "$OUTDIR/$TAG-$(basename "$j")"; done
  tar czf "$OUTDIR/$TAG.tgz" -C "$(dirname "$W")" "$TAG"
}
trap finish EXIT
# phase NAME SECONDS: whether the budget still holds SECONDS.
fits() {
  if [ "$(left)" -lt "$2" ]; then log "skip $1: $(left) s left, it needs about $2"; return 1; fi
  log "start $1"
}

{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
  nvcc --version | tail -2; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$W/machine.txt" 2>&1
head -3 "$W/machine.txt"

deps() { bash scripts/setup-deps.sh > "$W/deps.log" 2>&1; }

build() {
  if [ ! -f "$BUILD/build.ninja" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DEPKIT_BUILD_PYTHON=ON > "$W/cmake.log" 2>&1 || return 1
  fi
  ninja -C "$BUILD" epkit-moe epkit-run _C moe_test_router moe_test_gate moe_test_router_host test_moe_layer \
    > "$W/build.log" 2>&1
}

tests() {
  (cd "$BUILD" && timeout $(($(left) - 20)) ctest --output-on-failure --timeout 300 \
    -R '^(moe_test_router|moe_test_gate|moe_test_router_host|test_moe_layer_np1|test_moe_layer_np1_single_process|test_moe_layer_np1_deepseek_shapes)$') \
    > "$W/test.log" 2>&1
  local rc=$?
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$W/test.log" | tail -12
  return $rc
}

sanitize() {
  local rc=0 cs="compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 20"
  local rf='Router.DeepSeekGroupedTopK:Router.WarpKernelEveryLaneLayout:EachKernel/*'
  for tool in memcheck racecheck; do
    timeout 150 $cs --tool $tool "$BUILD/tests/moe/moe_test_router" --gtest_filter="$rf" > "$W/sanitize-$tool-router.log" 2>&1 || rc=1
    timeout 150 $cs --tool $tool "$BUILD/tests/moe/moe_test_gate" --gtest_filter='GateRouter.*' > "$W/sanitize-$tool-gate.log" 2>&1 || rc=1
  done
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$W"/sanitize-*.log
  return $rc
}

router() {
  timeout $(($(left) - 10)) "$BUILD/bin/epkit-moe" kernels --kernels router,gate_router \
    --router-kernels general,warp_grouped --rounds 5 --json "$W/router.json" > "$W/router.log" 2>&1
  local rc=$?
  grep -E "router|gate_router" "$W/router.log" | grep -E "us" | tail -30
  return $rc
}

gemm() {
  timeout 200 "$BUILD/bin/epkit-moe" kernels --kernels grouped_gemm --groups 8,16,32 --m 1,8,32,64,128 \
    --json "$W/gemm.json" > "$W/gemm.log" 2>&1
}

# DeepGEMM's rows go into gemm.json: this run's grouped GEMM run, else a router run for the ceilings (not
# --quick, whose FP8 ceiling is 4096^3 where the targets name 8192^3).
dg() {
  local layouts=$1
  if [ ! -f "$W/gemm.json" ]; then
    timeout 120 "$BUILD/bin/epkit-moe" kernels --kernels router --json "$W/gemm.json" > "$W/ceilings.log" 2>&1 ||
      { log "no JSON with the ceilings"; return 1; }
  fi
  local site=/tmp/site
  if [ ! -d $site/deep_gemm ] && ls .whl/tokenspeed_deepgemm-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site \
      .whl/tokenspeed_deepgemm-*.whl > "$W/pip.log" 2>&1
  fi
  timeout $(($(left) - 15)) env PYTHONPATH=$site:$BUILD/python python3 tools/epkit-moe/deepgemm_baseline.py \
    "$W/gemm.json" --layouts "$layouts" --jit-workers 12 --jit-cache "$BUILD/deepgemm-jit" ${DG_ARGS:-} > "$W/deepgemm-$layouts.log" 2>&1
  local rc=$?
  grep -E "deepgemm .* us|epkit / deepgemm|skipped|failed|Error" "$W/deepgemm-$layouts.log" | tail -40
  return $rc
}

layer() {
  timeout $(($(left) - 10)) "$BUILD/bin/epkit-moe" layer --experts 256,32 --batches 1,32,128 --query-lens 1,2 \
    --schedules none --json "$W/layer.json" > "$W/layer.log" 2>&1
  local rc=$?
  grep -E "^  none" "$W/layer.log" | tail -40
  return $rc
}

for phase in "$@"; do
  case $phase in
    deps) fits deps 30 && { deps; log "end deps rc=$?"; } ;;
    build) fits build 240 && { build; rc=$?; log "end build rc=$rc"; [ $rc -eq 0 ] || { tail -30 "$W/build.log"; exit 1; }; } ;;
    test) fits test 200 && { tests; log "end test rc=$?"; } ;;
    sanitize) fits sanitize 200 && { sanitize; log "end sanitize rc=$?"; } ;;
    router) fits router 120 && { router; log "end router rc=$?"; } ;;
    gemm) fits gemm 150 && { gemm; log "end gemm rc=$?"; } ;;
    dg-masked) fits dg-masked 240 && { dg masked; log "end dg-masked rc=$?"; } ;;
    dg-contiguous) fits dg-contiguous 180 && { dg contiguous; log "end dg-contiguous rc=$?"; } ;;
    layer) fits layer 300 && { layer; log "end layer rc=$?"; } ;;
    *) log "unknown phase $phase" ;;
  esac
done
