#!/bin/bash
# Session 18, device call 1 (issue 15, EP2 goal): the general kernels' decode units spread one per
# block (aa4ca66). Leave-out A/B at W = 1 with EPKIT_LOCAL_KERNELS=0, libraries built on the CPU machine:
#   tipx        the tree (no flags)
#   perslice    -DEPKIT_AB_COPY_PER_SLICE: the receive copy one warp per (message, slice), as before
#   packedgrid  -DEPKIT_AB_GRID_PACKED: the grids sized as before (16 warp units to a block)
#   gridonly    per slice + both block-major mappings: only the grids differ from base
#   base        main before this session (a86f625)
#   stages      the tree with -DEPKIT_STAGE_TIMERS
# Then a 128-token object's 1-token call (what an engine sizing for its largest batch runs), and the
# GPU suite (W = 1, 2, 4, 8 with several PEs on the GPU: the general kernels' correctness).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="tipx perslice packedgrid gridonly base" timeout 230 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 40 scripts/bench-ab.sh run-libs $W/m128 build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1 --max-tokens 128 --no-baselines > $W/m128.txt 2>&1; echo "m128 rc=$?"
sed -n '/median over/,$p' $W/m128.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log | head -n 40
echo "stamps t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 200 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|Total Test" $W/gpu-suite.log | tail -n 14
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
