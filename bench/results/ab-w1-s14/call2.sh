#!/bin/bash
# Session 14, device call 2 (issue 15): leave-one-out A/B of the general kernels at the tip
# (333dced) and the local tiny dispatch's load order, each library built on the CPU machine:
#   tipx      the tip built there (no flags): the offset between a box-built and a carried library
#   g1        -DEPKIT_AB_COMBINE_G1: one warp per slice, the grid as before
#   grid4     -DEPKIT_AB_GRID4: the combine grid sized for groups of four (call 1's tip)
#   seqearly  -DEPKIT_AB_SEQ_EARLY: the sequence number settled at kernel start
#   abortlate -DEPKIT_AB_ABORT_LATE: the abort flag read at the barriers, as before
#   tinylate  -DEPKIT_AB_TINY_LATE: the local tiny dispatch decodes before the piece's loads
#   s13       main's 3a43b3c, built from its tree
#   stages    the tip with -DEPKIT_STAGE_TIMERS (dispatch, combine, local)
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,32,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="tipx g1 grid4 seqearly abortlate s13" timeout 220 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 3 -- \
  "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
echo "gen t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="tipx tinylate s13" timeout 110 scripts/bench-ab.sh run-libs $W/local build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,4,32,128 --no-baselines > $W/local.txt 2>&1; echo "local rc=$?"
sed -n '/median over/,$p' $W/local.txt
echo "local t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 50 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log
echo "stamps t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
