#!/bin/bash
# Session 28, device call 3: ncu warp sampling of the fused 1-token general kernels with
# --replay-mode application (each pass reruns the bench, so the sampled kernel follows its real
# predecessors and their caches, unlike kernel replay's restore). Question: does instruction fetch
# ("no instruction") cost the timed loop anything? Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' build-gpu/CMakeCache.txt)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
EPKIT_LOCAL_KERNELS=0 LD_LIBRARY_PATH="$PWD/build-gpu/src:$PWD/build-gpu/src/moe${nvlib:+:$(dirname "$nvlib")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  timeout $(lim 300) ncu --replay-mode application --clock-control none --cache-control none --target-processes all \
  --section WarpStateStats --section SourceCounters --warp-sampling-interval 0 \
  -k "regex:dispatch_kernel|combine_kernel" --launch-skip 30 --launch-count 4 -o $W/prof-app \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines --iters 50 \
  > $W/ncu-app.log 2>&1
echo "ncu rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "==PROF==|==ERROR==" $W/ncu-app.log | sort | uniq -c | head -8
if [ -f $W/prof-app.ncu-rep ]; then
  ncu -i $W/prof-app.ncu-rep --page details --print-details all > $W/details-app.txt 2>&1
  ncu -i $W/prof-app.ncu-rep --page source --csv --print-source sass > $W/source-sass-app.csv 2>&1
  for f in $W/details-app.txt $W/source-sass-app.csv; do [ -s $f ] && xz -6 -T8 $f; done
  rm -f $W/prof-app.ncu-rep
fi
source scripts/ab-call-end.sh
