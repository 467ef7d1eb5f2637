#!/bin/bash
# Session 35, device call 2 (issue 15): match_key_bits with four ballots a pass (the tree,
# .ab/commit) against MATCH.ANY with shared sentinel keys ("sent": fb21db6 with only the decode send
# half's matches changed, branch s35-sentinel) and session 34's tip ("base", fb21db6).
# - the probe (match_probe.cu, call 2's version): every variant checked on random keys, then timed;
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 11 rounds, base / sent / tip;
# - the W = 1 kernels (EPKIT_LOCAL_KERNELS=1), 11 rounds, base / tip;
# - stamps (the grid's last block) at 1 token ("stbase": call 1's library, "st": the tree);
# - the GPU suite on the tip (W = 1, 2, 4, 8 on one GPU; test_warp_match).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
nvcc -O3 -arch=sm_90 -std=c++17 bench/results/ab-w1-s35/match_probe.cu -o $W/match_probe > $W/probe-build.log 2>&1 &&
  timeout $(lim 60) $W/match_probe > $W/match_probe.txt 2>&1
echo "probe rc=$? t=$(( $(date +%s) - t0 ))"; cat $W/match_probe.txt; rm -f $W/match_probe
ab_libs general 11 150 "base sent" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
EPKIT_LOCAL_KERNELS=1 EPKIT_AB_LIBS="base" timeout $(lim 100) scripts/bench-ab.sh run-libs \
  "$W/local" build-gpu --reps 11 -- --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines > "$W/local.txt" 2>&1
echo "local rc=$? t=$(( $(date +%s) - t0 ))"; sed -n '/median over/,$p' "$W/local.txt"
ab_stages stages 40 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
EPKIT_CALL_TEST_TIMEOUT=170 source scripts/ab-call-end.sh gpu-suite
