#!/usr/bin/env bash
# `make soak`: the MoE layer forward after forward (tests/layer/soak_moe_layer.cpp) at world size 1
# (one process, no NVSHMEM: what a one-GPU user runs) and at world size 2 (two PEs on one GPU),
# SOAK_MINUTES in all, half each; every SOAK_CHECK_EVERY-th output is checked against the host
# reference. Every schedule, both layouts, graph replays mixed with eager calls, random m in [0, M].
# Prints each run's line and writes BUILD/soak/report.json (date, commit, GPU, iterations, checks,
# mismatches, errors, device-memory growth). Exit status: non-zero on any mismatch, error or growth.
# Usage: scripts/soak.sh [BUILD]    (SOAK_MINUTES, default 10; SOAK_CHECK_EVERY, default 8)
set -uo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
MINUTES=${SOAK_MINUTES:-10}
EVERY=${SOAK_CHECK_EVERY:-8}
OUT=$BUILD/soak
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "=================================================================="
  echo "skipped: no GPU -- make soak did not run here"
  echo "=================================================================="
  exit 0
fi
BIN=$BUILD/tests/layer/soak_moe_layer
[ -x "$BIN" ] || { echo "soak: $BIN is missing: build first (make build)"; exit 1; }
mkdir -p "$OUT"
rm -f "$OUT"/w1.json "$OUT"/w2.json "$OUT"/report.json
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
half=$(awk -v m="$MINUTES" 'BEGIN { printf "%.3f", m / 2 }')
limit=$(awk -v m="$half" 'BEGIN { printf "%d", m * 60 + 300 }')  # the run's own deadline plus start-up and teardown
rc=0
echo "== soak: world size 1 (single process), $half min, check every $EVERY"
EPKIT_TEST_SINGLE_PROCESS=1 "$BUILD/bin/epkit-run" -n 1 --timeout "$limit" -- "$BIN" --minutes "$half" \
  --check-every "$EVERY" --json "$OUT/w1.json" || rc=1
echo "== soak: world size 2 (two PEs on one GPU), $half min, check every $EVERY"
"$BUILD/bin/epkit-run" -n 2 --timeout "$limit" -- "$BIN" --minutes "$half" --check-every "$EVERY" \
  --json "$OUT/w2.json" || rc=1
python3 - "$OUT" "$MINUTES" <<'PY'
import json, os, sys
out, minutes = sys.argv[1], float(sys.argv[2])
runs = [json.load(open(os.path.join(out, f))) for f in ("w1.json", "w2.json") if os.path.exists(os.path.join(out, f))]
keys = ("iterations", "checks", "mismatches", "errors")
report = {"date": runs[0]["date"] if runs else None, "commit": runs[0]["commit"] if runs else None,
          "gpu": runs[0]["gpu"] if runs else None, "minutes_requested": minutes,
          "runs_completed": len(runs), "runs": runs}
report.update({k: sum(r[k] for r in runs) for k in keys})
report["device_memory_growth_bytes"] = max([r["device_memory_growth_bytes"] for r in runs] or [0])
json.dump(report, open(os.path.join(out, "report.json"), "w"), indent=2)
print("soak: %d of 2 runs reported; %s; device memory growth %d bytes; report %s" % (
    len(runs), ", ".join("%s %d" % (k, report[k]) for k in keys), report["device_memory_growth_bytes"],
    os.path.join(out, "report.json")))
PY
[ -f "$OUT/w1.json" ] && [ -f "$OUT/w2.json" ] || rc=1
exit $rc
