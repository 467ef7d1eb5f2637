#!/bin/bash
# Session 34, device call 3 (issue 15): the dense recv_map rows as call 2 had them, but dispatch_recv
# numbers its copies in recv_map's order (no second array of first rows, no extra shared load);
# general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0):
# - "base": 862b9d2 (session 33's tip); tip: the tree (.ab/commit);
# - 11 rounds, V3 and V2-Lite at 1, 4, 128 tokens; stamps (the grid's last block) of both at 1 token
#   ("stbase", "st"); on an H200 only, the W = 1 run of the tip (bench/results/h200-w1-latest.json);
#   then the GPU suite on the tip (W = 1, 2, 4, 8 on one GPU; make test passed on call 2's tree, and
#   this call changes only the general dispatch_recv, which the CPU and Python suites do not run).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c3
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 11 150 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages 40 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
if grep -q H200 $W/gpu.txt; then
  PHASE_TIMEOUT=$(lim 150) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
  echo "comm-w1 t=$(( $(date +%s) - t0 ))"
fi
EPKIT_CALL_TEST_TIMEOUT=150 source scripts/ab-call-end.sh gpu-suite
