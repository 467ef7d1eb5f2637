#!/bin/bash
# Session 33, device call 1 (issue 15):
# 1. Session 31's protocol probe with the two candidate protocols (call 7 of ab-w1-s31, fixed after
#    its first run hung: see that folder's README), 3 rounds; standalone, built here.
# 2. Stamps of the general kernels' sending block (the grid's last block) at 1 token, V3 and
#    V2-Lite, with the new "topk loaded" stamp (EPKIT_STAGE_AFTER): where V3's 0.6 us lag starts.
#    "st": the tree's kernels; "stdelay": the same with -DEPKIT_AB_RECV_DELAY_NS=2000 (the receive
#    half sleeps 2 us before its first count poll): if the receivers' first polls delay the sender,
#    its stamps come earlier there.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
P=$OUT/c1probe
mkdir -p "$P"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v bench/results/ab-w1-s31/protocol_probe.cu \
  -o "$P/protocol_probe" > "$P/probe-build.log" 2>&1
echo "probe build rc=$?"
timeout 150 "$P/protocol_probe" > "$P/probe.txt" 2>&1
echo "probe rc=$?"
grep -E "^check|checks|error word" "$P/probe.txt" | tail -14
sed -n '/round 3/,$p' "$P/probe.txt" | grep -v "^check" | cut -c1-160
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$P/gpu.txt" 2>&1
rm -f "$P/protocol_probe"
source scripts/ab-call-start.sh $OUT/c1
ab_stages stages 150 "st stdelay" --preset decode,decode-v2lite --tokens 1 --no-baselines
source scripts/ab-call-end.sh
