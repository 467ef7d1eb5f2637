#!/bin/bash
# Session 13, device call 3 (issue 15): the general kernels' smaller decode code (2c1060a) against
# the four changes kept from call 2 (kept4 = dfc1c8a) and main (s12 = 6ea5787), W = 1 with
# EPKIT_LOCAL_KERNELS=0, 3 rounds; the local kernels against s12; stage stamps of the tip's general
# kernels; make test (every suite); the full W = 1 benchmark (bench/results/h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c3; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 scripts/gpu-session.sh $W/s build
echo "build t=$(( $(date +%s) - t0 ))"
ARGS=(--preset decode,decode-v2lite --tokens 1,32,128,256 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="kept4 s12" timeout 120 \
  scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
echo "gen t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s12" timeout 40 scripts/bench-ab.sh run-libs $W/local build-gpu --reps 2 -- "${ARGS[@]}" > $W/local.txt 2>&1; echo "local rc=$?"
sed -n '/median over/,$p' $W/local.txt | grep -E " (1|128) "
echo "local t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 30 scripts/bench-ab.sh run-libs $W/stages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/stamps.txt 2>&1; echo "stamps rc=$?"
grep -h "\[stages\]" $W/stages/stages-1.log
echo "stamps t=$(( $(date +%s) - t0 ))"
timeout 380 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|^== |passed|failed" $W/make-test.log | grep -v "^PASSED\|::" | head -20
echo "tests t=$(( $(date +%s) - t0 ))"
TAIL=3 PHASE_TIMEOUT=60 scripts/gpu-session.sh $W/s2 comm-w1
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "bench t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
