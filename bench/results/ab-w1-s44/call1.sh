#!/bin/bash
# Session 44, device call 2 (issue 15): the landed tree's W = 1 figures on whatever the lent kind
# gives. On an H200 this refreshes bench/results/h200-w1-latest.json (session 30's, e42a6ff, is the
# file's last H200 run; the W = 1 kernels changed in session 35). In order: the build, the W = 1
# run (the W = 1 kernels, both layouts, NCCL and NVSHMEM beside them), then the general kernels at
# W = 1 (EPKIT_LOCAL_KERNELS=0, decode and decode-v2lite, 1-128 tokens, m on the host, 3 runs).
# Carry [".deps/wheels", ".deps/googletest"]. Logs: $OUT/c2.tgz.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
# The tree's commit for the JSONs (the machine's copy has no history of its own): EPKIT_COMMIT=...
# on the run's command line (this call ran without it: see README).
L=$OUT/c2; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
TAIL=3 PHASE_TIMEOUT=300 scripts/gpu-session.sh $L/s build comm-w1 > $L/session.txt 2>&1
tail -8 $L/session.txt
if [ -x build-gpu/bin/epkit-bench ]; then
  for r in 1 2 3; do
    EPKIT_LOCAL_KERNELS=0 timeout 120 build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench \
      --preset decode,decode-v2lite --tokens 1,4,16,128 --no-baselines --json $L/general-$r.json > $L/general-$r.log 2>&1
    echo "general run $r rc=$?"
  done
  grep -h "^\[0\] decode" $L/general-*.log | grep epkit
fi
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $L
