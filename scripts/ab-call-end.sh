#!/usr/bin/env bash
# The common end of an A/B device call (sourced by bench/results/ab-*/callN.sh after
# scripts/ab-call-start.sh, which set W and t0): the tests the call asks for, then W packed into
# $OUT/<basename of W>.tgz (what the device tool brings back) and removed.
#   source scripts/ab-call-end.sh make-test   # CPU, GPU and Python suites (scripts/run-tests.sh)
#   source scripts/ab-call-end.sh gpu-suite   # ctest -L gpu only
#   source scripts/ab-call-end.sh             # no tests
# Calls before session 24 spelled this out in each script; they are kept as they ran.
case "${1:-none}" in
  make-test)
    timeout "${EPKIT_CALL_TEST_TIMEOUT:-300}" scripts/run-tests.sh build-gpu > "$W/make-test.log" 2>&1
    echo "make test rc=$?"
    grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" "$W/make-test.log" | tail -n 16
    cp build-gpu/Testing/Temporary/LastTest.log "$W/" 2>/dev/null ;;
  gpu-suite) ab_gpu_suite "${EPKIT_CALL_TEST_TIMEOUT:-200}" ;;
  none) ;;
  *) echo "ab-call-end.sh: unknown step '$1' (make-test, gpu-suite or none)" >&2 ;;
esac
echo "end t=$(( $(date +%s) - t0 ))"
tar czf "$OUT/$(basename "$W").tgz" -C "$(dirname "$W")" "$(basename "$W")" && rm -rf "$W"
