#!/bin/bash
# Session 35, device call 3 (issue 15): match_groups (the tree, .ab/commit: MATCH.ANY or ballots by
# the warp's distinct keys) against "sent" (call 2's MATCH.ANY with shared sentinels in the decode
# send half only, branch s35-sentinel) and "base" (fb21db6, session 34's tip).
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 15 rounds, base / sent / tip;
# - the W = 1 kernels (EPKIT_LOCAL_KERNELS=1), 15 rounds, base / tip;
# - stamps (the grid's last block) at 1 token ("stbase": fb21db6, "st": the tree);
# - on an H200 only, the W = 1 run of bench/results/h200-w1-latest.json;
# - make test on the tree (CPU, GPU and Python suites).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c3
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 15 150 "base sent" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
EPKIT_LOCAL_KERNELS=1 EPKIT_AB_LIBS="base" timeout $(lim 90) scripts/bench-ab.sh run-libs \
  "$W/local" build-gpu --reps 15 -- --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines > "$W/local.txt" 2>&1
echo "local rc=$? t=$(( $(date +%s) - t0 ))"; sed -n '/median over/,$p' "$W/local.txt"
ab_stages stages 40 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
if grep -q H200 $W/gpu.txt; then
  PHASE_TIMEOUT=$(lim 60) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
  echo "comm-w1 t=$(( $(date +%s) - t0 ))"
fi
EPKIT_CALL_TEST_TIMEOUT=$(lim 260) source scripts/ab-call-end.sh make-test
