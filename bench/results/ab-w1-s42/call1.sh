#!/bin/bash
# Session 42, device call 1 (issue 15). The working tree ("tip", built here as build-gpu) has the
# landed kernels (the A/B switches in device_common.cuh and combine.cu are off by default: SASS
# identical to e24d780's, checked with cuobjdump). In order:
# - the constant-cache probe (const_probe.cu, this folder): is the immediate-constant cache per SM
#   sub-partition, and how large; seconds, no build;
# - general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), tip against three libraries, 8 rounds, m on the
#   host and on the device:
#   u   = -DEPKIT_PARAM_TOUCH_UNIFORM=1: the decode kernels' parameter touch stored by every lane, so
#         that ptxas reads the lines by ULDC (the immediate-constant cache) instead of LDC (the indexed
#         one; the landed touch: ten LDC, one ULDC);
#   us  = u + -DEPKIT_PARAM_TOUCH_SPREAD=1 -DEPKIT_PARAM_TOUCH_GRID=1: the touch on one warp per SM
#         sub-partition, and gridDim's line with it;
#   usp = us + -DEPKIT_AB_TOKEN_PIN=1: the combine's token side reads its parameters at once after
#         its partials;
#   (between the two: one round of stage stamps of the landed kernels with the token side's detail
#   stamps, library stland, session 41's prepared call 2: -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_DETAIL);
# - the W = 1 run (comm-w1), which refreshes bench/results/h200-w1-latest.json on an H200, if 150 s
#   are left of EPKIT_CALL_BUDGET;
# - the GPU suite if 130 s are left.
# EPKIT_CALL_MIN=1 (for a call of under 300 s of device time, session 43): the probe, the build and a
# 4-round host A/B at 1 and 4 tokens only, and the stamps if 45 s are left.
# Libraries: scripts/bench-ab.sh prepare-lib, EPKIT_AB_UNITS="kernels/dispatch kernels/combine".
# Copy to .ab/run.sh (with .ab/commit); carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/c1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
( $NVCC -O3 -std=c++17 -arch=sm_90a bench/results/ab-w1-s42/const_probe.cu -o /tmp/const_probe &&
  timeout 60 /tmp/const_probe ) > $OUT/c1/const_probe.txt 2>&1
echo "const_probe rc=$?"; cat $OUT/c1/const_probe.txt
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
if [ "${EPKIT_CALL_MIN:-0}" = 1 ]; then
  ab_libs host 4 100 "u us usp" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
  [ $(lim 100) -ge 45 ] && ab_stages stamps 40 "stland" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
  source scripts/ab-call-end.sh
  return 0 2>/dev/null || exit 0
fi
ab_libs host 8 100 "u us usp" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stamps 40 "stland" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
ab_libs devm 8 90 "u us usp" --preset decode,decode-v2lite --tokens 1,4 --no-baselines --device-m
if [ $(lim 200) -ge 150 ]; then  # the device time left this session decides the budget: these last
  PHASE_TIMEOUT=$(lim 200) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
  echo "comm-w1 t=$(( $(date +%s) - t0 ))"
fi
[ $(lim 200) -ge 130 ] && ab_gpu_suite 200
source scripts/ab-call-end.sh
