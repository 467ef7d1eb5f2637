#!/bin/bash
# Session 13, device call 2 (issue 15): the general (W >= 2) kernels' eight changes, measured at
# W = 1 with EPKIT_LOCAL_KERNELS=0. run-libs A/B, 2 rounds: the tip (all eight) against "all7" (the
# first seven: the tip without the spread receive copy), "base" (every EPKIT_AB_ switch: the
# previous behaviour), one library per change left out of all7 (nopeer, nop2p, nopairs4, nopre,
# nohist, noctr, norpf) and s12 (main's 6ea5787, built from its tree).
# Then the local kernels (tip against s12: device_common.cuh changed under them), stage stamps of the
# tip's general kernels (block 0 and the last block), and the GPU suite (every world size).
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
ARGS=(--preset decode,decode-v2lite --tokens 1,32,128,256 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="all7 base nopeer nop2p nopairs4 nopre nohist noctr norpf s12" timeout 240 \
  scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 2 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt | grep -v "decode-v2lite    32\|decode-v2lite   256"
echo "gen t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s12" timeout 40 scripts/bench-ab.sh run-libs $W/local build-gpu --reps 2 -- "${ARGS[@]}" > $W/local.txt 2>&1; echo "local rc=$?"
sed -n '/median over/,$p' $W/local.txt
echo "local t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages stageslast" timeout 40 scripts/bench-ab.sh run-libs $W/stages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/stamps.txt 2>&1; echo "stamps rc=$?"
grep -h "\[stages\]" $W/stages/stages-1.log $W/stages/stageslast-1.log
echo "stamps t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 230 ctest -L gpu -j 8 --output-on-failure --timeout 220 > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?")
grep -E "tests passed|tests failed|Failed|\*\*\*|Total Test" $W/gpu-suite.log | head -20
echo "gpu suite t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
