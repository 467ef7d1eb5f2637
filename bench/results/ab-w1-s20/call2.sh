#!/bin/bash
# Session 20, device call 2 (issue 15): what the dispatch's first stage spends, and the layer
# tail's cp.async settled with more rounds. General kernels at W = 1 (EPKIT_LOCAL_KERNELS=0),
# libraries built on the CPU machine:
#   tip     this build: main with call 1's three changes (seq, hist, tail) and the Python helper
#   hist    call 1's `hist` (0868701): seq + hist, the tail still in registers
#   sttip   call 1's stamps library of the tip
#   once    the tip with -DEPKIT_STAGE_TIMERS -DEPKIT_AB_LDCG (twice.patch): top-k loads from L2
#   twice   once + -DEPKIT_AB_HIST_TWICE: the histogram run twice by the same code, "topk loaded"
#           stamped after pass 1 (pass 2 runs with warm instruction and constant caches)
# Then the full W = 1 benchmark (local kernels; bench/results/h200-w1-latest.json) and make test
# (CPU, GPU at W = 1..8, Python).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="hist" timeout 120 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 6 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="sttip once twice" timeout 90 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in sttip once twice; do for r in 1 2; do echo "== $l $r"; grep -h "\[stages\]" $W/gstages/$l-$r.log | head -n 8; done; done
echo "stamps t=$(( $(date +%s) - t0 ))"
TAIL=3 timeout 70 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 330 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
