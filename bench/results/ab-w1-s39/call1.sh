#!/bin/bash
# Session 39, device call 1 (issue 15): PREPARED, NEVER RAN (no machine could be started in twelve
# tries over 90 minutes; see README.md). The tree (.ab/commit = a299051, session 38's landed tree,
# never run on a GPU) against:
# - "monce": session 38's device-m-only m once in the decode combine (bench/results/ab-w1-s38/
#   monce.patch applied to the tree's combine.cu, then scripts/bench-ab.sh prepare-lib monce . with
#   EPKIT_AB_UNITS="kernels/dispatch kernels/combine");
# - "touchidle": touchidle.patch applied (an A/B switch, off by default), prepare-lib with
#   EPKIT_AB_FLAGS=-DEPKIT_AB_TOUCH_IDLE=1: the general decode kernels touch their parameter lines
#   on a warp that has no work at decode (dispatch warp 14, combine warp 13).
# Steps, each bounded by what is left of EPKIT_CALL_BUDGET (lim):
# - the GPU suite of the tree (W = 1, 2, 4, 8 on one GPU);
# - the instruction-fetch probe (icache_probe.cu), built here;
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), m on the device, C1_ROUNDS rounds (default 5);
# - ncu warp states of the tree's general kernels, the whole graph as one range;
# - the W = 1 run of the tree (scripts/gpu-session.sh comm-w1: bench/results/h200-w1-latest.json);
# - touchidle with m on the host, if time is left.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}  # the command passes less when less device time is left
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
# The GPU suite first (W = 1, 2, 4, 8 on one GPU): the landed tree's kernels must not be what the
# budget cuts. (Not all of make test: its CPU suite runs in CI, its Python suite tests bindings this
# tree did not change, and device time was short: most of it went to start attempts that got none.)
ab_gpu_suite 200
( timeout $(lim 75) bash -c "nvcc -O3 -arch=sm_90 -std=c++17 bench/results/ab-w1-s39/icache_probe.cu -o $W/icache_probe && $W/icache_probe" ) > $W/icache.txt 2>&1
echo "icache rc=$? t=$(( $(date +%s) - t0 ))"; cat $W/icache.txt; rm -f $W/icache_probe
ab_libs devm ${C1_ROUNDS:-5} 95 "monce touchidle" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --device-m
# Warp states of the general kernels (V3, 1 token) in the benchmark's steady state: the whole CUDA
# graph of 10 fused pairs profiled as one range (--graph-profiling graph: the kernels run back to
# back as in the timed replay, caches as the previous pair left them); session 28 profiled each launch
# alone (kernel replay). "No Instruction" = fetch stalls.
EPKIT_LOCAL_KERNELS=0 timeout $(lim 60) ncu --clock-control none --cache-control none --target-processes all \
  --graph-profiling graph --launch-skip 5 --launch-count 1 --section WarpStateStats --section SchedulerStats --page raw \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines > $W/ncu-graph.txt 2>&1
echo "ncu graph rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "==PROF==|==ERROR==|_kernel|stalled_(no_instruction|barrier|long_scoreboard|short_scoreboard|wait|imc_miss|membar|branch_resolving|lg_throttle|drain|sleeping)_per_issue_active|warp_latency_per_inst_issued" $W/ncu-graph.txt | grep -v "^\[0\]" | cut -c1-150 | head -60
PHASE_TIMEOUT=$(lim 120) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
[ $(lim 60) -ge 45 ] && ab_libs general 4 65 "touchidle" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
source scripts/ab-call-end.sh
