#!/bin/bash
# Session 16, device call 6 (issue 15): after the review refactor of local.cu (shared scale, count
# and map helpers; one choice of the one-warp path), the W = 1 tests of the one-warp dispatch only,
# with only their targets built (144 s of device time were left).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest"].
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
W=$OUT/c6; mkdir -p $W; t0=$(date +%s)
bash scripts/setup-deps.sh > $W/deps.log 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $W/cfg.log 2>&1 &&
  cmake --build build-gpu -j $(nproc) --target test_all_to_all test_reliability epkit-run > $W/build.log 2>&1; echo "build rc=$? t=$(( $(date +%s) - t0 ))"
tail -n 3 $W/build.log
for t in test_all_to_all test_reliability; do
  timeout 40 build-gpu/bin/epkit-run -n 1 -- build-gpu/tests/gpu/$t > $W/$t.log 2>&1; echo "$t rc=$?"
  grep -E "PASSED|FAILED|Failure" $W/$t.log | head -n 6
done
echo "t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c6.tgz -C $OUT c6 && rm -rf $W
