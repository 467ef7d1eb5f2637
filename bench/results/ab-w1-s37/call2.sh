#!/bin/bash
# Session 37, device call 2 (issue 15): the combine's token-side prefetch only where a warp's partials
# are its own (G = 1), against the tree without it ("base": -DEPKIT_AB_NO_TOKEN_PREFETCH) and with it
# in every fused decode call ("always": -DEPKIT_AB_PREFETCH_ALWAYS, call 1's rule); the dispatch is
# b7c9239's again (call 1's early slice reverted).
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 13 rounds, base / always / tip;
# - on an H200 only, the W = 1 run of bench/results/h200-w1-latest.json;
# - make test on the tree (CPU, GPU and Python suites).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-575}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 13 175 "base always" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
if grep -q H200 $W/gpu.txt; then
  PHASE_TIMEOUT=$(lim 60) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
  echo "comm-w1 t=$(( $(date +%s) - t0 ))"
fi
EPKIT_CALL_TEST_TIMEOUT=$(lim 270) source scripts/ab-call-end.sh make-test
