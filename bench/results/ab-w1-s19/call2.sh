#!/bin/bash
# Session 19, device call 2 (issue 15, EP2 goal): the token side's units from each block's last warp
# down (1dd2bee), on top of call 1's early barrier flag. General kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0), libraries built on the CPU machine:
#   tipx       the tree
#   sendfirst  -DEPKIT_AB_TOKEN_AFTER_SEND: token units from warp 0 up, as before (= call 1's tipx
#              without the early num_msgs load)
#   old        call 1's `old`: main's combine (288f87e)
#   stages     the tree with -DEPKIT_STAGE_TIMERS
# Then a 128-token object's 1-token call, the stamps, the full W = 1 benchmark (local kernels;
# bench/results/h200-w1-latest.json) and make test (CPU, GPU at W = 1..8, Python).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="tipx sendfirst old" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="sendfirst old" timeout 60 scripts/bench-ab.sh run-libs $W/m128 build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1 --max-tokens 128 --no-baselines > $W/m128.txt 2>&1; echo "m128 rc=$?"
sed -n '/median over/,$p' $W/m128.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log | head -n 8
echo "stamps t=$(( $(date +%s) - t0 ))"
TAIL=3 timeout 70 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 330 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
