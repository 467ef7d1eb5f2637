#!/bin/bash
# Session 13, device call 4 (issue 15): the fix of the large calls' scale loops (call 3's make test
# failed on them). Build; the general kernels, tip against kept4 and s12, 2 rounds (the fix is off
# the decode path: a check that it stayed so); make test (every suite).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c4; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 scripts/gpu-session.sh $W/s build
echo "build t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="kept4 s12" timeout 60 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
echo "gen t=$(( $(date +%s) - t0 ))"
timeout 370 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|\*\*\*|^== |[0-9]+ passed|[0-9]+ failed" $W/make-test.log | head -20
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
