#!/bin/bash
# Session 12, device call 5: the GPU suite (make test's label gpu) after IndicesAtAnyAlignment was
# cut to 40 cases; its time against call 2's 193 s. Carry [".deps/wheels", ".deps/googletest"].
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
W=$OUT/c5; mkdir -p $W
t0=$(date +%s)
TAIL=3 scripts/gpu-session.sh $W/s build
echo "build t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 190 ctest -L gpu -j 8 --output-on-failure > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?")
grep -E "tests passed|Failed|\*\*\*|Total Test|IndicesAtAnyAlignment" $W/gpu-suite.log | head -20
grep -E "Test +#" $W/gpu-suite.log | sort -t' ' -k1 | tail -30
echo "gpu suite t=$(( $(date +%s) - t0 ))"
