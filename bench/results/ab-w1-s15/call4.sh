#!/bin/bash
# Session 15, device call 4: the launch probe with the parameter-read cases (14 parameter words on
# 3 more 64-byte lines of the constant bank or not). No library build: the probe needs only nvcc.
# Copy to .ab/run.sh; carry [".ab"].
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
W=$OUT/c4; mkdir -p $W; t0=$(date +%s)
NVCC=$(command -v nvcc || python3 -c "import nvidia.cuda_nvcc as m, os; print(os.path.join(m.__path__[0], 'bin', 'nvcc'))" 2>/dev/null || ls /usr/local/cuda/bin/nvcc)
echo "nvcc: $NVCC"
$NVCC -O2 -std=c++17 -arch=sm_90a -I src -o $W/launch_probe bench/results/ab-w1-s15/launch_probe.cu > $W/probe-build.log 2>&1 \
  && timeout 90 $W/launch_probe > $W/launch-probe.txt 2>&1; echo "probe rc=$?"
cat $W/launch-probe.txt | grep -v "^$"; tail -3 $W/probe-build.log; rm -f $W/launch_probe
echo "probe t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
