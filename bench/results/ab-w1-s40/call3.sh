#!/bin/bash
# Session 40, device call 3 (issue 15): the tree with monce and the idle-warp parameter touch made
# permanent (the working tree, built here as build-gpu: "tip") against the landed tree's library
# ("base": scripts/bench-ab.sh prepare-lib base . on 89bf0a6, EPKIT_AB_UNITS="kernels/dispatch
# kernels/combine"). Steps:
# - the GPU suite of the new tree (W = 1, 2, 4, 8 on one GPU): the gate for landing it;
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), m on the host, then on the device, 8 rounds each;
# - ncu warp states of the general kernels (V3, 1 token) in the steady state: one graph replay of 10
#   pairs after the timed ones, alone in the profiler's range (epkit-bench --profile-graph), profiled
#   as one workload;
# - the W = 1 run of the new tree (comm-w1).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c3
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
ab_gpu_suite 220
ab_libs host 8 90 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_libs devm 8 90 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --device-m
EPKIT_LOCAL_KERNELS=0 timeout $(lim 60) ncu --clock-control none --cache-control none --target-processes all \
  --profile-from-start off --graph-profiling graph --section WarpStateStats --section SchedulerStats --page raw \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines --iters 50 --profile-graph > $W/ncu-graph.txt 2>&1
echo "ncu graph rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "==PROF==|==ERROR==|stalled_(no_instruction|barrier|long_scoreboard|short_scoreboard|wait|imc_miss|membar|branch_resolving|lg_throttle|drain|sleeping|selected|not_selected|dispatch_stall|math_pipe_throttle|mio_throttle|tex_throttle|misc)_per_issue_active|warp_latency_per_inst_issued|issue_active|gpu__time_duration" $W/ncu-graph.txt | grep -v "^\[0\]" | cut -c1-150 | head -40
PHASE_TIMEOUT=$(lim 90) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
source scripts/ab-call-end.sh
