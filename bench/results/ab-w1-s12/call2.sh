#!/bin/bash
# Session 12, device call 2 (issue 15): the kept steps of next/w1-s11 (fan dropped) plus the 4 KB
# piece. Build; run-libs A/B of the tip against s10 (035dbfd), rank (84893fa), vec (945e0cc) and
# nowide (the tip with -DEPKIT_LOCAL_WIDE_PIECE=0), 3 rounds; then make test (every GPU suite).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c2; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 scripts/gpu-session.sh $W/s build
echo "build t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s10 rank vec nowide" timeout 200 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,32,64,128,192,256 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
echo "ab t=$(( $(date +%s) - t0 ))"
timeout 400 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|Total Test|^== " $W/make-test.log | head -30
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
