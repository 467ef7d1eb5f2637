#!/bin/bash
# Session 17, device call 1 (issue 15): the CommParams field order again (74e96c2), now on the
# PieceUnits fix (4c3cf27: nvcc 13.0 miscompiled the one-warp dispatch's copy of its units, which is
# what broke that order in session 16). In order: the nvcc repro run on the GPU; the A/B of the tree
# (box build `tip`, CPU-built `reo`) against main before this session (`base` = 2102480), 3 rounds at
# 1 / 4 / 128 tokens; the full W = 1 benchmark of the tree; make test.
# Run 1 (this script without the loop bound of the repro and its timeout) hung in the repro: the
# miscompiled loop's stride was 0. It cost the call's 600 s; run 2 is this script.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
export NVCC=$(sed -n 's|^CMAKE_CUDA_COMPILER:[A-Z]*=||p' build-gpu/CMakeCache.txt)
$NVCC -O3 -arch=sm_90a -std=c++17 tools/nvcc-bugs/grid_constant_copy.cu -o /tmp/gcc_repro > $W/repro.log 2>&1 &&
  timeout 20 /tmp/gcc_repro >> $W/repro.log 2>&1; echo "repro rc=$?"; bash tools/nvcc-bugs/check.sh >> $W/repro.log 2>&1; tail -n 2 $W/repro.log
EPKIT_AB_LIBS="base reo" timeout 150 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- --preset decode-v2lite,decode \
  --tokens 1,4,128 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$? t=$(( $(date +%s) - t0 ))"
grep -A40 "median over" $W/ab.txt | head -n 30
TAIL=3 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 250 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" $W/make-test.log | tail -n 14
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
