#!/bin/bash
# Session 15, device call 1 (issue 15): the one-wave launch (only the blocks and warps that hold a
# unit) of the W = 1 one-path kernels, against `wide` (the tip with -DEPKIT_LOCAL_NARROW=0), `tipx`
# (the tip built on the CPU machine) and `base` (main before, 03a63f6), 3 rounds; an object sized
# for 256 tokens running 1-32 token calls; then make test with every test's output kept
# (LastTest.log: the per-case times, to trim the suite to its budget).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
EPKIT_AB_LIBS="tipx wide base" timeout 150 scripts/bench-ab.sh run-libs $W/loc build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,4,32,128 --no-baselines > $W/loc.txt 2>&1; echo "loc rc=$?"
sed -n '/median over/,$p' $W/loc.txt
echo "loc t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="wide" timeout 60 scripts/bench-ab.sh run-libs $W/big build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,4,32 --max-tokens 256 --no-baselines > $W/big.txt 2>&1; echo "big rc=$?"
sed -n '/median over/,$p' $W/big.txt
echo "big t=$(( $(date +%s) - t0 ))"
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$? (limit $left s)"
grep -E "tests passed|tests failed|\*\*\*|^== |[0-9]+ passed|[0-9]+ failed" $W/make-test.log | head -20
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
