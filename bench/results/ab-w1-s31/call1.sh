#!/bin/bash
# Session 31, device call 1: how much of the general pair's decode time the protocol itself needs.
# protocol_probe.cu (this folder) times stripped-down kernels that do only what the general protocol
# must do at V3, 1 token, W = 1, beside the one-pass shape of the W = 1 kernels, 3 rounds; then the
# library's general kernels (EPKIT_LOCAL_KERNELS=0, the tip, 5 rounds) in the same call, so the two
# compare on one machine. No library change is measured here.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v bench/results/ab-w1-s31/protocol_probe.cu \
  -o "$W/protocol_probe" > "$W/probe-build.log" 2>&1
echo "probe build rc=$? t=$(( $(date +%s) - t0 ))"
timeout $(lim 120) "$W/protocol_probe" > "$W/probe.txt" 2>&1
echo "probe rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "^check|checks|round 3" -A0 "$W/probe.txt"; sed -n '/round 3/,$p' "$W/probe.txt" | cut -c1-150
ab_libs general 5 120 "" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$W/gpu.txt" 2>&1
rm -f "$W/protocol_probe"
source scripts/ab-call-end.sh
