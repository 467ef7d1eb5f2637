#!/bin/bash
# Prepared in session 40 for the next session's first call (issue 15); NOT RUN. Where the chain
# threads of the general decode kernels wait, line by line, in the benchmark's steady state:
# ncu's warp sampling (SourceCounters) and warp states of one graph replay of 10 fused pairs (V3,
# 1 token, EPKIT_LOCAL_KERNELS=0), alone in the profiler's range (epkit-bench --profile-graph),
# profiled as one workload. Session 40's call 3 profiled the same replay for WarpStateStats only:
# barrier 67% of all warps' stalls, no instruction 1.8%; the averages hide the chain threads. Then
# the same with --device-m. Session 28's per-kernel sampling used kernel replay (cold caches).
# Copy to .ab/run.sh (with .ab/commit); carry [".deps/wheels", ".deps/googletest", ".ab"].
# Summaries: scripts/ncu_stalls.py on the source CSVs (one section per profiled result; a graph
# result may list its kernels' SASS together: check the CSV's kernel column before trusting
# --kernel).
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-400}
source scripts/ab-call-start.sh $OUT/n1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }  # the -lineinfo paths
for m in host device; do
  extra=(); [ $m = device ] && extra=(--device-m)
  EPKIT_LOCAL_KERNELS=0 timeout $(lim 120) ncu --clock-control none --cache-control none --target-processes all \
    --profile-from-start off --graph-profiling graph --section WarpStateStats --section SourceCounters \
    --import-source yes -o $W/prof-graph-$m build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench \
    --preset decode --tokens 1 --no-baselines --profile-graph "${extra[@]}" > $W/ncu-$m.log 2>&1
  echo "ncu $m rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "==PROF==|==ERROR==|==WARNING==" $W/ncu-$m.log | sort | uniq -c | head -8
  ab_ncu_export graph-$m  # details-graph-$m.txt.xz, source-sass-graph-$m.csv.xz, source-cuda-sass-...
done
source scripts/ab-call-end.sh
