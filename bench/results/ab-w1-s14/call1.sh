#!/bin/bash
# Session 14, device call 1 (issue 15). Four changes (docs/perf-notes/2026-12-01-w1-s14.md):
#   1773698 local tiny dispatch: index word and first piece loaded before the index is decoded
#           (W = 1 local kernels, 1 to 4 tokens);
#   f4109b5 general combine_send: up to four warps share a partial slice (small P2P variant);
#   08799b2 general receive copy's header loads together; combine_send's message counts first.
# The general kernels (every world size >= 2) are measured at W = 1 with EPKIT_LOCAL_KERNELS=0.
# Libraries: tip (the box's build), leave-one-out g1 (-DEPKIT_AB_COMBINE_G1: one warp per slice),
# serial (-DEPKIT_AB_COPY_SERIAL), late (-DEPKIT_AB_NMSG_LATE); s13 (main's 3a43b3c, built from
# its tree); stages (tip with -DEPKIT_STAGE_TIMERS).
# Then the GPU suite (every world size, several PEs on the one GPU).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,32,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="g1 serial late s13" timeout 200 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 3 -- \
  "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
echo "gen t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s13" timeout 90 scripts/bench-ab.sh run-libs $W/local build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,4,32,128 --no-baselines > $W/local.txt 2>&1; echo "local rc=$?"
sed -n '/median over/,$p' $W/local.txt
echo "local t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 50 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log
EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/lstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/lstamps.txt 2>&1; echo "lstamps rc=$?"
grep -h "\[stages\]" $W/lstages/stages-1.log
echo "stamps t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 230 ctest -L gpu -j 8 --output-on-failure --timeout 220 > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?")
grep -E "tests passed|tests failed|Failed|\*\*\*|Total Test" $W/gpu-suite.log | head -20
echo "gpu suite t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
