#!/bin/bash
# Session 12, device call 3 (issue 15): the tip (4 KB piece kept). Build; the full W = 1 benchmark
# (bench/results/h200-w1-latest.json, both layouts, baselines); run-libs A/B of the tip against
# scalar (scans of any length one word per lane: -DEPKIT_LOCAL_SCAN_VEC_MIN=2^30), vmin (scalar below
# 640 words) and v4 (4 vectors in flight per lane), 3 rounds; stage stamps (lib "stages", built with
# -DEPKIT_STAGE_TIMERS); the layer benchmark --quick.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libs.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c3; mkdir -p $W
t0=$(date +%s)
(cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz)
TAIL=3 PHASE_TIMEOUT=200 scripts/gpu-session.sh $W/s build comm-w1
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "bench t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="scalar vmin v4" timeout 150 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,32,64,128,192,256 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
echo "ab t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="stages" timeout 60 scripts/bench-ab.sh run-libs $W/stages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/stamps.log 2>&1; echo "stamps rc=$?"
grep -iE "stamp|stage|tokens=" $W/stamps.log | head -40
echo "stamps t=$(( $(date +%s) - t0 ))"
left=$(( 570 - ($(date +%s) - t0) ))
timeout $left build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-moe layer --quick --json $W/layer-quick.json > $W/layer.txt 2>&1; echo "layer rc=$?"
tail -25 $W/layer.txt
echo "layer t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
