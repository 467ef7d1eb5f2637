#!/bin/bash
# Session 23, device call 3 (issue 15): the session's final tree (recv_map in message order; the
# parameter-line touch in the W = 1 kernels only): the full W = 1 benchmark into
# bench/results/h200-w1-latest.json, the general kernels against session 22's end (base = 616a44c,
# built on the CPU machine) with and without weights at dispatch, then make test.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
TAIL=3 timeout 150 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 80 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 5 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 80 scripts/bench-ab.sh run-libs \
  $W/wad build-gpu --reps 5 -- "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/wad.txt
timeout 280 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
