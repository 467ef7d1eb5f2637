#!/usr/bin/env bash
# Runs test_fault under epkit-run and checks what the library promises on a fault (docs/RELIABILITY.md):
#   - the launcher returns non-zero and says which rank failed;
#   - every surviving rank reports a timeout that names the faulty rank (the last one) and the phase
#     it waited in (dispatch for kill / skip-dispatch, combine for skip / kill-combine), within
#     timeout + 5 s of the faulty iteration;
#   - with API layer, each survivor's next forward() raised at once (< 1 s) that the layer is unusable;
#   - no test process is left behind.
# Usage: fault_test.sh EPKIT_RUN TEST_FAULT NP kill|skip-dispatch|skip|kill-combine [all_to_all|layer]
set -u
run=$1; bin=$2; np=$3; mode=$4; api=${5:-all_to_all}
case "$mode" in
  kill|skip-dispatch) phase=dispatch ;;
  skip|kill-combine) phase=combine ;;
  *) echo "fault_test.sh: unknown mode $mode"; exit 2 ;;
esac
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo "skipped: no GPU"; exit 77; fi
# The bounded wait under test: its own knob, not an EPKIT_TIMEOUT_MS inherited from the caller's
# environment (an exported 120 s one outlasted the launcher's 30 s grace and the test's 120 s limit,
# and the test failed for that reason alone). It must stay well inside both.
fault_ms=${EPKIT_FAULT_TIMEOUT_MS:-3000}
if [ "$fault_ms" -gt 20000 ]; then echo "FAULT TEST FAILED ($mode): EPKIT_FAULT_TIMEOUT_MS=$fault_ms exceeds 20000 (the launcher's grace is 30 s)"; exit 1; fi
[ -n "${EPKIT_TIMEOUT_MS:-}" ] && [ "$EPKIT_TIMEOUT_MS" != "$fault_ms" ] && echo "note: EPKIT_TIMEOUT_MS=$EPKIT_TIMEOUT_MS from the environment is replaced by $fault_ms for this test"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 EPKIT_TIMEOUT_MS=$fault_ms
log=$(mktemp)
start=$(date +%s)
"$run" -n "$np" --grace-ms 30000 -- "$bin" --mode "$mode" --api "$api" > "$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
fail() { echo "FAULT TEST FAILED ($mode, $api): $*"; rm -f "$log"; exit 1; }
[ "$rc" -ne 0 ] || fail "epkit-run returned 0"
victim=$((np - 1))
for r in $(seq 0 $((victim - 1))); do
  line=$(grep "^\[$r\] rank $r: iteration" "$log") || fail "rank $r reported no error"
  echo "$line" | grep -q "timed out" || fail "rank $r: not a timeout: $line"
  echo "$line" | grep -q "from rank $victim" || fail "rank $r: the error does not name rank $victim: $line"
  echo "$line" | grep -q " in ${phase}_" || fail "rank $r: the error does not name the $phase phase: $line"
  ms=$(echo "$line" | sed -E 's/^[^:]*: iteration [0-9]+ failed after ([0-9]+) ms.*/\1/')
  [ "$ms" -le $((EPKIT_TIMEOUT_MS + 5000)) ] || fail "rank $r took $ms ms (> timeout + 5 s)"
  echo "time to error: rank $r, $ms ms (timeout $EPKIT_TIMEOUT_MS ms)"
  if [ "$api" = layer ]; then
    reuse=$(grep "^\[$r\] rank $r: reuse raised after" "$log") || fail "rank $r: the layer's next forward did not raise"
    echo "$reuse" | grep -q "unusable" || fail "rank $r: the reuse error does not say the layer is unusable: $reuse"
    # The reuse message quotes the first error ("... timed out after 3000 ms"): take the first number.
    rms=$(echo "$reuse" | sed -E 's/^[^:]*: reuse raised after ([0-9]+) ms.*/\1/')
    [ "$rms" -lt 1000 ] || fail "rank $r: the refused forward took $rms ms"
  fi
done
sleep 1
if pgrep -f "$(basename "$bin") --mode" > /dev/null; then fail "processes left behind: $(pgrep -af "$(basename "$bin") --mode")"; fi
echo "fault test passed ($mode, $api, $np ranks, ${elapsed}s, launcher rc $rc, hangs 0)"
rm -f "$log"
