#!/usr/bin/env bash
# The common start of an A/B device call (sourced by bench/results/ab-*/callN.sh, from the repository
# root on the GPU machine): the box's environment, the carried libraries unpacked, and the build.
#   source scripts/ab-call-start.sh LOGDIR
# Sets W (LOGDIR, created) and t0, and exports EPKIT_COMMIT from .ab/commit; end the call with
# `source scripts/ab-call-end.sh [make-test|gpu-suite]`. The call carries
# [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libraries of
# `scripts/bench-ab.sh prepare-lib`, packed here with
#   tar cf - -C .ab lib | xz -9e -T2 > .ab/libs.tar.xz && rm -rf .ab/lib
# (-9e: its window spans the libraries, which are alike: five 14 MB ones pack into 10 MB instead of
# 25 at the default level, room that the 64 MiB limit on what a call carries needs).
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS  # the tests set their own bounds
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=${1:?usage: source scripts/ab-call-start.sh LOGDIR}
mkdir -p "$W"
t0=$(date +%s)
if [ -f .ab/libs.tar.xz ]; then (cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz); fi
TAIL=3 scripts/gpu-session.sh "$W/s" build
echo "build t=$(( $(date +%s) - t0 ))"
# lim MAX: seconds a step may take, MAX or what is left of the call's budget (EPKIT_CALL_BUDGET,
# default 570 s of the device tool's 600), whichever is less. Session 25's scripts defined it each.
lim() { local l=$(( ${EPKIT_CALL_BUDGET:-570} - ($(date +%s) - t0) )); [ $l -lt $1 ] && echo $l || echo $1; }
# ab_libs DIR REPS MAX "LIBS" [epkit-bench args]: scripts/bench-ab.sh run-libs of the general kernels at
# W = 1 (EPKIT_LOCAL_KERNELS=0) into $W/DIR, log $W/DIR.txt, its medians printed.
ab_libs() {
  local dir=$1 reps=$2 max=$3 libs=$4
  shift 4
  EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="$libs" timeout $(lim $max) scripts/bench-ab.sh run-libs \
    "$W/$dir" build-gpu --reps $reps -- "$@" > "$W/$dir.txt" 2>&1
  echo "$dir rc=$? t=$(( $(date +%s) - t0 ))"
  sed -n '/median over/,$p' "$W/$dir.txt"
}
# ab_gpu_suite MAX: the GPU suite (ctest -L gpu) into $W/gpu-suite.log, bounded by lim MAX, its
# summary printed (also ab-call-end.sh's gpu-suite step, there at the call's end).
ab_gpu_suite() {
  (cd build-gpu && timeout $(lim $1) ctest -L gpu -j 8 --output-on-failure) > "$W/gpu-suite.log" 2>&1
  echo "gpu suite rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W/gpu-suite.log" | tail -n 8
}
# ab_stages DIR MAX "LIBS" [epkit-bench args]: one round of stamps libraries (ab_libs with
# --stage-timers), then each library's stage means.
ab_stages() {
  local dir=$1 max=$2 libs=$3 l
  shift 3
  ab_libs "$dir" 1 "$max" "$libs" "$@" --stage-timers
  for l in $libs; do echo "== $l"; grep -h "\[stages\].*mean" "$W/$dir/$l-1.log" | head -n 6; done
}
# ab_ncu TAG LIBDIR MAX [ncu options] -- [epkit-bench args]: the general kernels at W = 1 under ncu
# (LIBDIR's libepkit first on the library path, e.g. build-gpu/src or .ab/lib/NAME), the report's
# details page and source CSVs (SASS, and CUDA + SASS: needs -lineinfo and the sources at the path
# they were built from, /work/main) into $W, xz-compressed; the report itself is removed.
ab_ncu() {
  local tag=$1 lib=$2 max=$3 opts=() nvlib
  shift 3
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' build-gpu/CMakeCache.txt)
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
  EPKIT_LOCAL_KERNELS=0 LD_LIBRARY_PATH="$(realpath "$lib"):$PWD/build-gpu/src/moe${nvlib:+:$(dirname "$nvlib")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout $(lim $max) ncu --clock-control none --cache-control none --target-processes all "${opts[@]}" \
    -k "regex:dispatch_kernel|combine_kernel" -o "$W/prof-$tag" \
    build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench "$@" > "$W/ncu-$tag.log" 2>&1
  echo "ncu $tag rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "==PROF==|==ERROR==" "$W/ncu-$tag.log" | sort | uniq -c | head -8
  ab_ncu_export "$tag"
}
# ab_ncu_export TAG: $W/prof-TAG.ncu-rep (if there) as its details page and source CSVs (SASS, and
# CUDA + SASS), xz-compressed into $W; the report itself is removed (too large to bring back).
ab_ncu_export() {
  local tag=$1 f
  [ -f "$W/prof-$tag.ncu-rep" ] || return 0
  ncu -i "$W/prof-$tag.ncu-rep" --page details --print-details all > "$W/details-$tag.txt" 2>&1
  ncu -i "$W/prof-$tag.ncu-rep" --page source --csv --print-source sass > "$W/source-sass-$tag.csv" 2>&1
  ncu -i "$W/prof-$tag.ncu-rep" --page source --csv --print-source cuda,sass > "$W/source-cuda-sass-$tag.csv" 2>&1
  for f in "$W/details-$tag.txt" "$W"/source-*-"$tag".csv; do [ -s "$f" ] && xz -6 -T8 "$f"; done
  rm -f "$W/prof-$tag.ncu-rep"
}
