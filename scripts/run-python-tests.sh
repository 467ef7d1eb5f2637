#!/usr/bin/env bash
# The Python suite (python/tests) against the extension in the build tree; needs torch.
# Usage: scripts/run-python-tests.sh [BUILD] [pytest args...]   e.g. -m "not stress" (make test), -m stress
set -uo pipefail
BUILD=${1:-build}
shift || true
cd "$(dirname "$0")/.."
if [ ! -f "$BUILD/python/epkit/__init__.py" ]; then
  echo "skipped: Python suite (the build has no Python extension: nanobind was not importable at configure time)"
  exit 0
fi
if ! python3 -c "import torch" >/dev/null 2>&1; then
  echo "skipped: Python suite (torch is not installed for $(command -v python3))"
  exit 0
fi
echo "== Python suite $*"
# --durations=0: every test's time, so the 5-minute budget of `make test` can be checked per test.
# With pytest-xdist, EPKIT_PY_TEST_JOBS (default 3) tests at a time. The GPU suite showed NVSHMEM
# failing to map its heap with more than 8 PEs on one GPU at once: a test spawns up to 4 ranks, and
# the four-rank tests share one worker (xdist_group "four_pes", --dist loadgroup), so three at a
# time stay within 4 + 2 + 2. Most of a spawned test's time is start-up (torch import, CUDA, NVSHMEM
# bootstrap), which overlaps well.
par=()
python3 -c "import xdist" >/dev/null 2>&1 && [ "${EPKIT_PY_TEST_JOBS:-3}" -gt 1 ] && par=(-n "${EPKIT_PY_TEST_JOBS:-3}" --dist loadgroup)
# The fuzzer's outcomes (test_fuzz.py) are merged into $BUILD/fuzz/fuzz-report.json.
export EPKIT_FUZZ_REPORT_DIR=${EPKIT_FUZZ_REPORT_DIR:-$(cd "$BUILD" && pwd)/fuzz}
PYTHONFAULTHANDLER=1 NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -m pytest -q -rs --durations=0 "${par[@]}" python/tests "$@"
rc=$?
[ $rc -eq 5 ] && { echo "python: no tests collected"; rc=0; }
exit $rc
