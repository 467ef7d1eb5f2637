#!/bin/bash
# Session 41, device call 1 (issue 15). The working tree ("tip", built here as build-gpu) has three
# changes to the general decode kernels:
# - combine: the token side's first entries are copied into shared memory by cp.async at the kernel's
#   start, beside the send half's first loads, instead of loaded after the partials
#   (copy_expert_async);
# - dispatch: every warp takes the message prefix and its first copy unit (source, message, its
#   address) before the data wait, from the counts it already has, instead of thread 0's prefix in
#   shared memory read after the data barrier (CopyUnit, msg_first);
# - combine: the send half's first loads (its group's map row, the message counts) are issued before
#   m's load, not after m's store to shared memory, which waits for it (send_start).
# Libraries (scripts/bench-ab.sh prepare-lib NAME ., EPKIT_AB_UNITS="kernels/dispatch kernels/combine",
# __nv_relfatbin removed to fit the carry): base = HEAD ed58c76's kernels; hoist = base + the first
# change; hc = base + the first two; stbase / sttip = base / tip with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_DETAIL. Steps:
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), tip against hc, hoist and base, m on the host then on the device;
# - one round of stage stamps of each (V3 and V2-Lite, 1 and 4 tokens, m on the host and on the device);
# - the GPU suite of the tip (W = 1, 2, 4, 8 on one GPU): the gate for landing it;
# - session 40's prepared ncu warp sampling (next-call.sh) of the tip, m on the host, if time is left.
# Copy to .ab/run.sh (with .ab/commit); carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
ab_libs host 8 130 "base hoist hc" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_libs devm 8 130 "base hoist hc" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --device-m
ab_stages stages 40 "stbase sttip" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
ab_stages stagesd 40 "stbase sttip" --preset decode,decode-v2lite --tokens 1,4 --no-baselines --device-m
ab_gpu_suite 200
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }  # the -lineinfo paths
if [ $(lim 100) -ge 90 ]; then
  EPKIT_LOCAL_KERNELS=0 timeout $(lim 100) ncu --clock-control none --cache-control none --target-processes all \
    --profile-from-start off --graph-profiling graph --section WarpStateStats --section SourceCounters \
    --import-source yes -o $W/prof-graph-host build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench \
    --preset decode --tokens 1 --no-baselines --profile-graph > $W/ncu-host.log 2>&1
  echo "ncu host rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "==PROF==|==ERROR==|==WARNING==" $W/ncu-host.log | sort | uniq -c | head -8
  ab_ncu_export graph-host
fi
source scripts/ab-call-end.sh
