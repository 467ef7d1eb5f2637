#!/bin/bash
# Session 13, device call 1 (issue 15): where the general (W >= 2) kernels spend their time, at W = 1
# with EPKIT_LOCAL_KERNELS=0. Build; the all-to-all tests touched by e8ae6e7 (never run on a GPU);
# the general kernels' timings (tip, 2 rounds) and stage stamps of block 0 ("stages") and of the
# grid's last block ("stageslast": there the send half of a 1-token call runs).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c1; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 scripts/gpu-session.sh $W/s build
echo "build t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 150 ctest -j8 -R 'test_all_to_all_np1$|test_all_to_all_np1_general_kernels|test_all_to_all_np2_dp_1$' --output-on-failure > $W/tests.txt 2>&1; echo "tests rc=$?")
grep -E "cases passed|Failed|\*\*\*|tests passed|Total Test" $W/tests.txt | head -30
echo "tests t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages stageslast" timeout 120 scripts/bench-ab.sh run-libs $W/gen build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,32,128 --no-baselines --stage-timers > $W/gen.txt 2>&1; echo "gen rc=$?"
sed -n '/median over/,$p' $W/gen.txt
grep -h "\[stages\]" $W/gen/stages-1.log $W/gen/stageslast-1.log
echo "gen t=$(( $(date +%s) - t0 ))"
EPKIT_LOCAL_KERNELS=0 timeout 60 scripts/bench-ab.sh run-libs $W/gen2 build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,32,128,256 --no-baselines > $W/gen2.txt 2>&1; echo "gen2 rc=$?"
sed -n '/median over/,$p' $W/gen2.txt | head -3
echo "gen2 t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
