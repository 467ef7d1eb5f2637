#!/bin/bash
# Session 37, device call 1 (issue 15): two changes to the general kernels' decode chains, A/B'd
# against the tree with both switched off ("base": -DEPKIT_AB_NO_EARLY_SLICE
# -DEPKIT_AB_NO_TOKEN_PREFETCH), and each alone ("noslice": the combine's token-side prefetch only;
# "nopf": the dispatch's early slice only); "tip" is the tree (.ab/commit) with both.
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 12 rounds, base / noslice / nopf / tip;
# - stamps at 1 token: the grid's last block ("stbase", "st") and block 0 ("stbase0", "st0");
# - on an H200 only, the W = 1 run of bench/results/h200-w1-latest.json;
# - make test on the tree (CPU, GPU and Python suites).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-575}
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 12 175 "base noslice nopf" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages 45 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
ab_stages stages0 45 "stbase0 st0" --preset decode,decode-v2lite --tokens 1 --no-baselines
if grep -q H200 $W/gpu.txt; then
  PHASE_TIMEOUT=$(lim 60) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
  echo "comm-w1 t=$(( $(date +%s) - t0 ))"
fi
EPKIT_CALL_TEST_TIMEOUT=$(lim 270) source scripts/ab-call-end.sh make-test
