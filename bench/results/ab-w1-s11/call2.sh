#!/bin/bash
# Device call 2 after next-call1.sh (issue 15), once the kept steps are on the tip: the full W = 1
# benchmark (bench/results/h200-w1-latest.json), make test, the layer benchmark --quick, stage stamps.
# bench/results/ab-w1-s11/README.md says how to run it. Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS
# The device copy's .git has been stale: the JSONs' git_commit comes from .ab/commit
# (here: git rev-parse HEAD > .ab/commit before the call).
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=$OUT/c2; mkdir -p $W
t0=$(date +%s)
TAIL=3 PHASE_TIMEOUT=300 scripts/gpu-session.sh $W/s build comm-w1 w1-stages
echo "bench t=$(( $(date +%s) - t0 ))"
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
timeout 240 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|Failed|Total Test" $W/make-test.log | head
echo "tests t=$(( $(date +%s) - t0 ))"
timeout 200 build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-moe layer --quick --json $W/layer-quick.json > $W/layer.txt 2>&1; echo "layer rc=$?"
grep -E "batch=(1|8|32) " $W/layer.txt | head -20
echo "layer t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
