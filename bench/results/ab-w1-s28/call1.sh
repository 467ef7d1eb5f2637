#!/bin/bash
# Session 28, device call 1: what bounds the general kernels' 1-token chains (session 27's "Next").
# - cuobjdump --dump-sass of the general dispatch and combine (the "lineinfo" library: this tree's
#   dispatch.cu / combine.cu with -lineinfo, which adds line tables and leaves the code alone);
# - ncu warp-state sampling (--clock-control none) of three general dispatch and combine launches
#   at V3, 1 token, W = 1 (EPKIT_LOCAL_KERNELS=0), with per-instruction stall reasons.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
{ which ncu cuobjdump nvdisasm; ncu --version; uname -r; } > $W/tools.txt 2>&1; cat $W/tools.txt
LIB=$PWD/.ab/lib/lineinfo
nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' build-gpu/CMakeCache.txt)
export LD_LIBRARY_PATH="$LIB:$PWD/build-gpu/src/moe${nvlib:+:$(dirname "$nvlib")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The line tables name this machine's paths (/work/main/...): let them resolve here too.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
timeout $(lim 60) cuobjdump --dump-sass $LIB/libepkit.so > $W/sass-all.txt 2>$W/sass.err
echo "sass rc=$? lines=$(wc -l < $W/sass-all.txt) t=$(( $(date +%s) - t0 ))"
grep -n "Function : .*\(dispatch_kernel\|combine_kernel\)" $W/sass-all.txt | head -40
xz -6 -T8 $W/sass-all.txt
export EPKIT_LOCAL_KERNELS=0
NCU=(ncu --clock-control none --cache-control none --target-processes all
     --section WarpStateStats --section SourceCounters --section LaunchStats --section SchedulerStats
     --warp-sampling-interval 0 -k "regex:dispatch_kernel|combine_kernel" --launch-skip 40 --launch-count 6)
for preset in decode decode-v2lite; do
  timeout $(lim 150) "${NCU[@]}" -o $W/prof-$preset build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench \
    --preset $preset --tokens 1 --no-baselines --iters 200 > $W/ncu-$preset.log 2>&1
  echo "ncu $preset rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "==PROF==|==ERROR==|==WARNING==" $W/ncu-$preset.log | sort | uniq -c | head -8
  R=$W/prof-$preset.ncu-rep
  [ -f $R ] || continue
  ncu -i $R --page details --print-details all > $W/details-$preset.txt 2>&1
  ncu -i $R --page source --csv --print-source sass > $W/source-sass-$preset.csv 2>&1 || echo "source sass rc=$?"
  ncu -i $R --page source --csv --print-source cuda,sass > $W/source-cuda-sass-$preset.csv 2>&1 || echo "source cuda,sass rc=$?"
  ncu -i $R --page raw --csv > $W/raw-$preset.csv 2>&1 || echo "raw rc=$?"
  head -c 600 $W/source-sass-$preset.csv; echo
  ls -la $W | tail -n 12
  for f in $W/source-*-$preset.csv $W/raw-$preset.csv; do [ -s $f ] && xz -6 -T8 $f; done
done
# The reports come back only while the packed folder stays under the 16 MB a file may have.
du -sh $W; find $W -name '*.ncu-rep' -size +5M -print -delete
source scripts/ab-call-end.sh
