#!/bin/bash
# Session 40, device call 1a (issue 15): what needs no A/B library, sent first because machines
# were scarce (session 39 got none in twelve tries). The landed tree (.ab/commit), in order of value:
# - the GPU suite (W = 1, 2, 4, 8 on one GPU): a299051's kernels have never run on a GPU;
# - the instruction-fetch probe (bench/results/ab-w1-s39/icache_probe.cu), built here;
# - the general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), tip only, 3 rounds, m on the host;
# - ncu warp states of the general kernels (V3, 1 token), the whole CUDA graph as one range;
# - the W = 1 run of the tree (comm-w1: bench/results/h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c1a
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
ab_gpu_suite 200
( timeout $(lim 75) bash -c "nvcc -O3 -arch=sm_90 -std=c++17 bench/results/ab-w1-s39/icache_probe.cu -o $W/icache_probe && $W/icache_probe" ) > $W/icache.txt 2>&1
echo "icache rc=$? t=$(( $(date +%s) - t0 ))"; cat $W/icache.txt; rm -f $W/icache_probe
ab_libs general 3 60 "" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
EPKIT_LOCAL_KERNELS=0 timeout $(lim 60) ncu --clock-control none --cache-control none --target-processes all \
  --graph-profiling graph --launch-skip 5 --launch-count 1 --section WarpStateStats --section SchedulerStats --page raw \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines > $W/ncu-graph.txt 2>&1
echo "ncu graph rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "==PROF==|==ERROR==|_kernel|stalled_(no_instruction|barrier|long_scoreboard|short_scoreboard|wait|imc_miss|membar|branch_resolving|lg_throttle|drain|sleeping)_per_issue_active|warp_latency_per_inst_issued" $W/ncu-graph.txt | grep -v "^\[0\]" | cut -c1-150 | head -60
PHASE_TIMEOUT=$(lim 120) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
source scripts/ab-call-end.sh
