#!/bin/bash
# Session 28, device call 2: the tree without the 8-byte stack frame (err_where; tip, built here)
# against "base" (6f4956c's kernels: dispatch, combine and local with the frame):
# - the GPU suite on the tip (error records now pass through err_where);
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 9 rounds; W = 1 kernels, 9 rounds;
# - ncu warp sampling of the fused 1-token general dispatch and combine ("lineinfo": the tip with
#   -lineinfo), the bench's first warm-up pairs (launches 31-36), which call 1 missed (it took the
#   split halves);
# - the W = 1 run of the tip (h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ab_gpu_suite 170
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs general 9 120 "base" "${ARGS[@]}"
EPKIT_AB_LIBS="base" timeout $(lim 120) scripts/bench-ab.sh run-libs "$W/local" build-gpu --reps 9 -- "${ARGS[@]}" \
  > "$W/local.txt" 2>&1; echo "local rc=$? t=$(( $(date +%s) - t0 ))"; sed -n '/median over/,$p' "$W/local.txt"
timeout $(lim 40) scripts/gpu-session.sh $W/s comm-w1 > $W/comm-w1.txt 2>&1; echo "comm-w1 rc=$? t=$(( $(date +%s) - t0 ))"
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
LIB=$PWD/.ab/lib/lineinfo
nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' build-gpu/CMakeCache.txt)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
EPKIT_LOCAL_KERNELS=0 LD_LIBRARY_PATH="$LIB:$PWD/build-gpu/src/moe${nvlib:+:$(dirname "$nvlib")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  timeout $(lim 90) ncu --clock-control none --cache-control none --target-processes all \
  --section WarpStateStats --section SourceCounters --section LaunchStats --warp-sampling-interval 0 \
  -k "regex:dispatch_kernel|combine_kernel" --launch-skip 30 --launch-count 6 -o $W/prof-fused \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines --iters 200 \
  > $W/ncu-fused.log 2>&1
echo "ncu rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "==PROF==|==ERROR==" $W/ncu-fused.log | sort | uniq -c | head -6
if [ -f $W/prof-fused.ncu-rep ]; then
  ncu -i $W/prof-fused.ncu-rep --page details --print-details all > $W/details-fused.txt 2>&1
  ncu -i $W/prof-fused.ncu-rep --page source --csv --print-source sass > $W/source-sass-fused.csv 2>&1
  ncu -i $W/prof-fused.ncu-rep --page source --csv --print-source cuda,sass > $W/source-cuda-sass-fused.csv 2>&1
  for f in $W/source-*-fused.csv; do [ -s $f ] && xz -6 -T8 $f; done
  rm -f $W/prof-fused.ncu-rep
fi
source scripts/ab-call-end.sh
