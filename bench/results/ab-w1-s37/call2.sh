#!/bin/bash
# Session 37, device call 2 (issue 15): two changes to the general kernels, each alone and together
# ("tip", the tree, .ab/commit), against the tree with both switched off ("base":
# -DEPKIT_AB_NO_TOKEN_PREFETCH -DEPKIT_AB_NO_EARLY_ABORT, b7c9239's kernels in effect):
# - "pfonly" (-DEPKIT_AB_NO_EARLY_ABORT): the combine's token-side prefetch, now only where a warp's
#   partials are its own (G = 1; call 1 had it in every fused decode call);
# - "abonly" (-DEPKIT_AB_NO_TOKEN_PREFETCH): dispatch_recv's thread 0 loads the abort flag before
#   its offsets instead of after them (block 0's stamps in call 1: offsets 2.54 -> data 2.84 us).
# Steps: general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 12 rounds; block-0 stamps of base and
# tip at 1 token; on an H200 only, the W = 1 run of bench/results/h200-w1-latest.json; make test.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-575}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 12 180 "base pfonly abonly" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages0 45 "stbase0 st0" --preset decode,decode-v2lite --tokens 1 --no-baselines
if grep -q H200 $W/gpu.txt; then
  PHASE_TIMEOUT=$(lim 60) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
  echo "comm-w1 t=$(( $(date +%s) - t0 ))"
fi
EPKIT_CALL_TEST_TIMEOUT=$(lim 270) source scripts/ab-call-end.sh make-test
