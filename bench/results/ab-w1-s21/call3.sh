#!/bin/bash
# Session 21, device call 3 (issue 15): the full W = 1 benchmark on the session's final tree (the
# W = 1 combines changed with the bf16 unpack, 725b72a), into bench/results/h200-w1-latest.json,
# and the general kernels (EPKIT_LOCAL_KERNELS=0) of the same build once more beside it.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
TAIL=3 timeout 120 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 timeout 60 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
