#!/bin/bash
# Session 14, device call 4 (issue 15): the landing tree, with one warp per slice back on the loop
# it ran before the groups. The general kernels against c3 (call 3's tree, 5852bf1) and s13 (main,
# 3a43b3c), 2 rounds, 1 to 256 tokens; the full W = 1 benchmark; make test (every suite).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="c3 s13" timeout 90 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,32,128,256 --no-baselines > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
echo "gen t=$(( $(date +%s) - t0 ))"
TAIL=3 scripts/gpu-session.sh $W/s4 comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 360 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|\*\*\*|^== |[0-9]+ passed|[0-9]+ failed" $W/make-test.log | head -20
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
