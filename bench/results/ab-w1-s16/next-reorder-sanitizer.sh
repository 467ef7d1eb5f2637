#!/bin/bash
# For the next session (not run yet): why `CommParams` with the W = 1 decode fields first
# (reorder.patch, session 16 call 4) broke the masked one-warp dispatch. Applies the patch to the
# carried tree, builds, runs the failing case plainly, then under compute-sanitizer's memcheck and
# racecheck (KINDS.md: seen working on Firecracker boxes; the W = 1 case needs no peer).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"] (.ab/reorder.patch = this folder's).
set -u
git apply .ab/reorder.patch || exit 1
source scripts/ab-call-start.sh $OUT/rs
T=build-gpu/tests/gpu/test_reliability
F=--gtest_filter=Reliability.DeviceSideErrorsAreReportedNotWritten:Reliability.StressAgainstReference
timeout 60 build-gpu/bin/epkit-run -n 1 -- $T $F > $W/plain.log 2>&1; echo "plain rc=$?"; grep -E "OK|FAILED|Failure" $W/plain.log | head
for tool in memcheck racecheck; do
  timeout 200 build-gpu/bin/epkit-run -n 1 -- compute-sanitizer --tool $tool --print-limit 20 $T \
    --gtest_filter=Reliability.DeviceSideErrorsAreReportedNotWritten > $W/$tool.log 2>&1; echo "$tool rc=$?"
  grep -E "ERROR SUMMARY|Invalid|hazard|at 0x" $W/$tool.log | head -20
done
tar czf $OUT/rs.tgz -C $OUT rs && rm -rf $W
