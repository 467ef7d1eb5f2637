#!/bin/bash
# Session 12, device call 4 (issue 15): the tip as it lands (4 KB piece, scalar scans below 640 words).
# Build; W = 1 tests + np2 dp 1; the full W = 1 benchmark (bench/results/h200-w1-latest.json);
# run-libs A/B against s10 (035dbfd), 3 rounds, objects of the call's size and of 4096 tokens;
# stage stamps (lib "stages" = this tip with -DEPKIT_STAGE_TIMERS).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c4; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 PHASE_TIMEOUT=120 scripts/gpu-session.sh $W/s build comm-w1
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "bench t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 150 ctest -j8 -R 'test_all_to_all_np1$|test_all_to_all_np1_layout_packed|test_all_to_all_np2_dp_1$|test_moe_layer_np1$' --output-on-failure > $W/tests.txt 2>&1; echo "tests rc=$?")
grep -E "cases passed|Failed|\*\*\*|Passed|tests passed" $W/tests.txt | head -30
echo "tests t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s10" timeout 90 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,32,64,128,192,256 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
EPKIT_AB_LIBS="s10" timeout 60 scripts/bench-ab.sh run-libs $W/maxtok build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,32,128 --max-tokens 4096 --no-baselines > $W/maxtok.txt 2>&1; echo "maxtok rc=$?"
sed -n '/median over/,$p' $W/maxtok.txt
echo "ab t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/stages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/stamps.log 2>&1; echo "stamps rc=$?"
grep -h "\[stages\]" $W/stages/stages-1.log
echo "stamps t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
