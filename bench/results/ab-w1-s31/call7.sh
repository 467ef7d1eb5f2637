#!/bin/bash
# Prepared in session 31, not yet run (the session's device time was spent): the probe with the two
# candidates for a protocol with one dependent hop fewer at decode (dispatch by direct placement,
# combine by pull; docs/perf-notes/2026-12-05-protocol-floor-s31.md, section 6), three rounds.
# No library build: the probe is standalone. Run with `bash bench/results/ab-w1-s31/call7.sh`,
# carrying nothing.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
W=$OUT/c7
mkdir -p "$W"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v bench/results/ab-w1-s31/protocol_probe.cu \
  -o "$W/protocol_probe" > "$W/probe-build.log" 2>&1
echo "probe build rc=$?"
timeout 240 "$W/protocol_probe" > "$W/probe.txt" 2>&1
echo "probe rc=$?"
grep -E "^check|checks" "$W/probe.txt" | tail -12; sed -n '/round 3/,$p' "$W/probe.txt" | grep -v "^check" | cut -c1-150
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$W/gpu.txt" 2>&1
rm -f "$W/protocol_probe"
