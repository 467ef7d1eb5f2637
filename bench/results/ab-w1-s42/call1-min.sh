#!/bin/bash
# call1.sh cut to what fits in under 300 s of device time (session 43, after eleven failed starts):
# the constant-cache probe, the build, and the host A/B of tip against u, us, usp (4 rounds, V3 and
# V2-Lite at 1 and 4 tokens, m on the host). Same libraries and carry as call1.sh.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/c1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
( $NVCC -O3 -std=c++17 -arch=sm_90a bench/results/ab-w1-s42/const_probe.cu -o /tmp/const_probe &&
  timeout 40 /tmp/const_probe ) > $OUT/c1/const_probe.txt 2>&1
echo "const_probe rc=$?"; cat $OUT/c1/const_probe.txt
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-200}
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
ab_libs host 4 100 "u us usp" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
[ $(lim 100) -ge 45 ] && ab_stages stamps 40 "stland" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
source scripts/ab-call-end.sh
