#!/bin/bash
# Session 14, device call 3 (issue 15): the landing tree. Build; the full W = 1 benchmark
# (bench/results/h200-w1-latest.json); the general and the local kernels against main (s13,
# 3a43b3c) in the same call, 2 rounds; make test (every suite).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
TAIL=3 scripts/gpu-session.sh $W/s3 comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="s13" timeout 60 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,32,128,256 --no-baselines > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_AB_LIBS="s13" timeout 50 scripts/bench-ab.sh run-libs $W/local build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines > $W/local.txt 2>&1; echo "local rc=$?"
sed -n '/median over/,$p' $W/local.txt
echo "ab t=$(( $(date +%s) - t0 ))"
timeout 360 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|\*\*\*|^== |[0-9]+ passed|[0-9]+ failed" $W/make-test.log | head -20
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
