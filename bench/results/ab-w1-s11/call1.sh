#!/bin/bash
# Session 12 (or the next lent one), device call 1 (issue 15): branch next/w1-s11 at its tip.
# Build, W = 1 tests (fan on and off, both layouts, + np2 dp 1, the layer at W = 1), A/B of the tip against
# s10 (035dbfd, measured), rank (one-path rank kernel), vec (+16-byte scans), wave2 (+two-chunk
# one-wave combine), fan (tip with the fan dispatch on); objects larger than the call
# (--max-tokens 4096: the per-call kernel choice, local and general kernels) tip vs s10; ncu memory
# metrics at 128 tokens.
# bench/results/ab-w1-s11/README.md says how to run it. Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
# The device copy's .git has been stale: the JSONs' git_commit comes from .ab/commit
# (here: git rev-parse HEAD > .ab/commit before the call).
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c1; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 scripts/gpu-session.sh $W/s build
echo "build t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 200 ctest -j8 -R 'test_all_to_all_np1$|test_all_to_all_np1_layout_packed|test_all_to_all_np1_general_kernels|test_all_to_all_np1_fan|test_all_to_all_np2_dp_1$|test_moe_layer_np1' --output-on-failure > $W/tests.txt 2>&1; echo "tests rc=$?")
grep -E "cases passed|Failed|\*\*\*|Passed|sec$" $W/tests.txt | head -30
echo "tests t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s10 rank vec wave2 fan" timeout 240 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,32,128,256 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
echo "ab t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="s10" timeout 120 scripts/bench-ab.sh run-libs $W/maxtok build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,32,128 --max-tokens 4096 --no-baselines > $W/maxtok.txt 2>&1; echo "maxtok rc=$?"
sed -n '/median over/,$p' $W/maxtok.txt
# The general (W >= 2) kernels at W = 1 on a prefill-sized object: large variant only for large calls.
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="s10" timeout 100 scripts/bench-ab.sh run-libs $W/maxtok-general build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1,128 --max-tokens 4096 --no-baselines > $W/maxtok-general.txt 2>&1; echo "maxtok-general rc=$?"
sed -n '/median over/,$p' $W/maxtok-general.txt
echo "maxtok t=$(( $(date +%s) - t0 ))"
M=gpu__time_duration.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed
for fan in 0 1; do EPKIT_LOCAL_FAN=$fan timeout 90 ncu --clock-control none --cache-control none --target-processes all \
  --kernel-name regex:local_ --launch-skip 400 --launch-count 4 --metrics $M build-gpu/bin/epkit-run -n 1 -- \
  build-gpu/bin/epkit-bench --preset decode --tokens 128 --no-baselines > $W/ncu-fan$fan.txt 2>&1; echo "ncu fan=$fan rc=$?"
  grep -E "local_|gpu__time|lts__|dram__|l1tex|sm__thr" $W/ncu-fan$fan.txt | head -40; done
echo "ncu t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
