#!/bin/bash
# Session 31, device call 2: call 1's probe could not be set beside the library's numbers (the
# probe's graph figure was one pair per replay, the bench's is ten; the bench puts a barrier kernel
# before each sample, the probe did not; the W = 1 kernels were not run). Now, on one machine:
# the probe (3 rounds; each event-timed pair bare and behind a stand-in barrier kernel; graphs of ten
# pairs), then the library's W = 1 kernels and its general kernels (EPKIT_LOCAL_KERNELS=0), 3 rounds
# each, V3 and V2-Lite at 1 and 4 tokens.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v bench/results/ab-w1-s31/protocol_probe.cu \
  -o "$W/protocol_probe" > "$W/probe-build.log" 2>&1
echo "probe build rc=$? t=$(( $(date +%s) - t0 ))"
timeout $(lim 120) "$W/protocol_probe" > "$W/probe.txt" 2>&1
echo "probe rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "checks" "$W/probe.txt"; sed -n '/round 3/,$p' "$W/probe.txt" | grep -v "^check" | cut -c1-150
EPKIT_LOCAL_KERNELS=1 timeout $(lim 120) scripts/bench-ab.sh run-libs "$W/local" build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,4 --no-baselines > "$W/local.txt" 2>&1
echo "local rc=$? t=$(( $(date +%s) - t0 ))"; sed -n '/median over/,$p' "$W/local.txt"
ab_libs general 3 120 "" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$W/gpu.txt" 2>&1
rm -f "$W/protocol_probe"
source scripts/ab-call-end.sh
