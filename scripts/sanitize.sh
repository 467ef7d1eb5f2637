#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over reduced cases of every kernel family:
# `make sanitize`. One GPU, a time budget (default 10 minutes), one summary line per tool.
#
# Usage: scripts/sanitize.sh BUILD_DIR [memcheck|synccheck|racecheck ...]   (default: all three, in
# that order: racecheck, the slowest, last, so that a spent budget cuts the fewest families)
# Environment:
#   SANITIZE_BUDGET_S   wall-clock budget of the whole run (default 600). Each step runs under
#                       `timeout` with what is left (at most SANITIZE_STEP_S, default 420); a step
#                       that is cut, or never starts, is reported "not finished" / "not run",
#                       never as clean.
#   SANITIZE_JOBS       PEs (processes) sanitized at once on the GPU (default 6; a W = 4 step takes 4)
#   SANITIZE_FAMILIES   space-separated subset of: a2a_w1 a2a_w2 a2a_w4 router quant gemm silu_mul_quant layer
#   SANITIZE_OUT        logs and summary.json (default BUILD_DIR/sanitize)
#   EPKIT_TIMEOUT_MS    the device-wait bound under the tools (default 900000: longer than any step,
#                       so that a slow kernel is cut by the step's limit, "not finished", and never
#                       turns into a timeout error of the library)
#
# Families and their reduced cases (the test binaries' own options):
#   a2a_w1   test_all_to_all, world size 1, one process without NVSHMEM (EPKIT_TEST_SINGLE_PROCESS=1);
#            memcheck: the quick sweep, split phases, overflow; racecheck/synccheck: split phases
#   a2a_w2   test_all_to_all --dp 1, 2 PEs on the GPU through epkit-run; memcheck: split phases,
#            overflow, per-call dtypes; racecheck/synccheck: split phases
#   a2a_w4   test_all_to_all --dp 1, 4 PEs: split phases
#   router   moe_test_router (every test; racecheck/synccheck: DeepSeek grouped and Mixtral softmax top-k)
#   quant    moe_test_quant (activations and weights)
#   gemm     moe_test_grouped_gemm, one process per compiled config (--gemm-config; SANITIZE_GEMM_CONFIGS
#            picks some): masked uneven
#            counts and packed unaligned offsets (memcheck adds the clamped-count and graph-replay tests)
#   silu_mul_quant  moe_test_activation (racecheck/synccheck: masked and packed)
#   layer    test_moe_layer --quick, world size 1 single-process, one process per schedule (none,
#            dispatch_overlap, microbatch), packed layout; memcheck adds the masked layout
#
# racecheck findings are classified, never dropped:
#   known      the CUTLASS 4.2 blockwise-scaling mainloop's fp32 scale tiles: cp.async writes
#              (SM80_CP_ASYNC_CACHEALWAYS<float, float>) against the consumers' copy_if reads, which
#              an mbarrier orders (cp.async.mbarrier.arrive.noinc); proof in docs/RELIABILITY.md
#              ("racecheck and the grouped GEMM"). Only blocks whose every access is one of those two
#              count as known.
#   external   every access inside NVIDIA's closed cuBLASLt kernels (nvjet_*, the layer's gate GEMM):
#              reported, not analysed (no source), and not counted against epkit
#   epkit      everything else: an error
# Exit status: 0 iff every step ran to its end, every test passed, and no tool found an error
# (memcheck, synccheck: any; racecheck: any "epkit" hazard).
set -uo pipefail
BUILD=${1:?usage: scripts/sanitize.sh BUILD_DIR [memcheck|racecheck|synccheck ...]}
shift
TOOLS=("$@")
[ ${#TOOLS[@]} -eq 0 ] && TOOLS=(memcheck synccheck racecheck)
cd "$(dirname "$0")/.."
BUILD=$(cd "$BUILD" && pwd)
OUT=${SANITIZE_OUT:-$BUILD/sanitize}
BUDGET=${SANITIZE_BUDGET_S:-600}
STEP_MAX=${SANITIZE_STEP_S:-420}
JOBS=${SANITIZE_JOBS:-6}
FAMILIES=${SANITIZE_FAMILIES:-a2a_w1 a2a_w2 a2a_w4 router quant gemm silu_mul_quant layer}
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 EPKIT_TIMEOUT_MS=${EPKIT_TIMEOUT_MS:-900000}

if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "=================================================================="
  echo "skipped: no GPU -- make sanitize did not run here"
  echo "=================================================================="
  exit 0
fi
SAN=$(command -v compute-sanitizer || true)
[ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
[ -z "$SAN" ] && { echo "sanitize: compute-sanitizer not found (CUDA toolkit bin/ on PATH)"; exit 1; }
RUN="$BUILD/bin/epkit-run"
for f in "$RUN" "$BUILD/tests/gpu/test_all_to_all" "$BUILD/tests/moe/moe_test_router" "$BUILD/tests/layer/test_moe_layer"; do
  [ -x "$f" ] || { echo "sanitize: $f is missing: build first (make build)"; exit 1; }
done
rm -rf "$OUT"
mkdir -p "$OUT"

# --- the steps ---------------------------------------------------------------------------------------
# One step per line: tool|family|case|PEs|environment (space-separated k=v, or -)|command after the
# sanitizer (for PEs >= 1 run through epkit-run, which each rank runs compute-sanitizer under).
STEPS=()
A2A="$BUILD/tests/gpu/test_all_to_all"
GEMM_BIN="$BUILD/tests/moe/moe_test_grouped_gemm"
gemm_configs() {  # SANITIZE_GEMM_CONFIGS, else every compiled config (CUTLASS's and epkit's own) from the one list
  if [ -n "${SANITIZE_GEMM_CONFIGS:-}" ]; then echo "$SANITIZE_GEMM_CONFIGS"; return; fi
  grep -E '^EPKIT_GEMM(_OWN)?_CONFIG\(' src/moe/gemm/gemm_configs.def | sed -E 's/^EPKIT_GEMM(_OWN)?_CONFIG\(([a-z0-9_]+),.*/\2/'
}
add() { STEPS+=("$1|$2|$3|$4|$5|$6"); }
for tool in "${TOOLS[@]}"; do
  case "$tool" in memcheck|racecheck|synccheck) ;; *) echo "sanitize: unknown tool $tool"; exit 2 ;; esac
  full=0; [ "$tool" = memcheck ] && full=1
  for fam in $FAMILIES; do
    case "$fam" in
      a2a_w1)
        f='AllToAll.SplitPhasesWithForeignKernels'
        [ $full = 1 ] && f='AllToAll.SweepAgainstReference:AllToAll.SplitPhasesWithForeignKernels:AllToAll.OverflowIsReportedNotWritten'
        add "$tool" a2a_w1 single_process 1 "EPKIT_TEST_SINGLE_PROCESS=1" "$A2A --sweep quick --gtest_filter=$f" ;;
      a2a_w2)
        f='AllToAll.SplitPhasesWithForeignKernels'
        [ $full = 1 ] && f='AllToAll.SplitPhasesWithForeignKernels:AllToAll.OverflowIsReportedNotWritten:AllToAll.DTypesChosenPerCall'
        add "$tool" a2a_w2 dp1 2 - "$A2A --dp 1 --sweep quick --gtest_filter=$f" ;;
      a2a_w4)
        add "$tool" a2a_w4 dp1 4 - "$A2A --dp 1 --sweep quick --gtest_filter=AllToAll.SplitPhasesWithForeignKernels" ;;
      router)
        f='Router.DeepSeekGroupedTopK:Router.MixtralSoftmaxTopK'
        [ $full = 1 ] && f='*'
        add "$tool" router all 0 - "$BUILD/tests/moe/moe_test_router --gtest_filter=$f" ;;
      quant)
        add "$tool" quant all 0 - "$BUILD/tests/moe/moe_test_quant" ;;
      gemm)
        f='GroupedGemm.MaskedUnevenCounts:GroupedGemm.PackedUnalignedOffsetsAndSpareRows'
        [ $full = 1 ] && f="$f:GroupedGemm.CountAboveRowsIsClampedAndReported:GroupedGemm.GraphReplayWithChangingCounts"
        for c in $(gemm_configs); do
          add "$tool" gemm "$c" 0 - "$GEMM_BIN --gemm-config $c --gtest_filter=$f"
        done ;;
      silu_mul_quant)
        f='SiluMulQuant.MaskedDeepSeekAndOddWidths:SiluMulQuant.Packed'
        [ $full = 1 ] && f='*'
        add "$tool" silu_mul_quant all 0 - "$BUILD/tests/moe/moe_test_activation --gtest_filter=$f" ;;
      layer)
        for s in none dispatch_overlap microbatch; do
          f="Schedules/MoELayerTest.MatchesReference/${s}_packed"
          [ $full = 1 ] && f="$f:Schedules/MoELayerTest.MatchesReference/${s}_masked"
          add "$tool" layer "$s" 1 "EPKIT_TEST_SINGLE_PROCESS=1" "$BUILD/tests/layer/test_moe_layer --quick --gtest_filter=$f"
        done ;;
      *) echo "sanitize: unknown family $fam"; exit 2 ;;
    esac
  done
done

# --- running them -----------------------------------------------------------------------------------
start=$SECONDS
deadline=$((start + BUDGET))
declare -A PID_SLOTS=()
used=0
echo "== compute-sanitizer ($("$SAN" --version 2>/dev/null | grep -i version | head -1)), tools: ${TOOLS[*]}, ${#STEPS[@]} steps, budget ${BUDGET} s, ${JOBS} PEs at a time, logs in $OUT"
WAIT_P=0
[ "${BASH_VERSINFO[0]}" -gt 5 ] || { [ "${BASH_VERSINFO[0]}" -eq 5 ] && [ "${BASH_VERSINFO[1]}" -ge 1 ]; } && WAIT_P=1
reap() {  # waits for one step to end and frees its slots
  local pid="" p
  if [ $WAIT_P = 1 ]; then
    wait -n -p pid || true
  else
    sleep 1
  fi
  if [ -n "$pid" ] && [ -n "${PID_SLOTS[$pid]:-}" ]; then
    used=$((used - PID_SLOTS[$pid]))
    unset "PID_SLOTS[$pid]"
    return
  fi
  used=0  # recount the live ones
  for p in "${!PID_SLOTS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then used=$((used + PID_SLOTS[$p])); else unset "PID_SLOTS[$p]"; fi
  done
}
i=0
for step in "${STEPS[@]}"; do
  IFS='|' read -r tool fam case np env cmd <<< "$step"
  i=$((i + 1))
  name="$tool.$fam.$case"
  log="$OUT/$name.log"
  slots=$(( np > 0 ? np : 1 ))
  while [ $((used + slots)) -gt "$JOBS" ] && [ "$used" -gt 0 ]; do reap; done
  left=$((deadline - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "status=not_run reason=budget" > "$OUT/$name.status"
    echo "  [$i/${#STEPS[@]}] $name: not run (budget of ${BUDGET} s spent)"
    continue
  fi
  limit=$(( left < STEP_MAX ? left : STEP_MAX ))
  san=("$SAN" --tool "$tool" --report-api-errors no --print-limit 100000)
  envs=()
  [ "$env" != "-" ] && read -r -a envs <<< "$env"
  (
    set -f  # the gtest filters hold '*'
    t0=$SECONDS
    if [ "$np" -ge 1 ]; then
      env "${envs[@]}" timeout --kill-after=20 "$limit" "$RUN" -n "$np" -- "${san[@]}" $cmd > "$log" 2>&1
    else
      env "${envs[@]}" timeout --kill-after=20 "$limit" "${san[@]}" $cmd > "$log" 2>&1
    fi
    rc=$?
    echo "status=done rc=$rc seconds=$((SECONDS - t0)) limit=$limit pes=$np" > "$OUT/$name.status"
  ) &
  PID_SLOTS[$!]=$slots
  used=$((used + slots))
  echo "  [$i/${#STEPS[@]}] $name started (limit ${limit} s): ${env/#-/} $cmd"
done
while [ "${#PID_SLOTS[@]}" -gt 0 ]; do
  reap
  for p in "${!PID_SLOTS[@]}"; do kill -0 "$p" 2>/dev/null || unset "PID_SLOTS[$p]"; done
done
wait
elapsed=$((SECONDS - start))

# --- reading the logs -------------------------------------------------------------------------------
# classify LOG TOOL: prints "errors known external summaries instances": racecheck's reports (one per
# access pair of a "Race reported between" block) by class, and their hazard instances; memcheck and
# synccheck: the errors of the tool's ERROR SUMMARY lines. Writes the unexplained blocks to LOG.findings.
classify() {
  awk -v tool="$2" -v findings="$1.findings" '
    function flush(   n, i, kn, ext, line, ok) {
      if (blk == "") return
      n = split(blk, L, "\n"); kn = 1; ext = 1
      for (i = 1; i <= n; i++) {
        line = L[i]
        if (line !~ /access at/) continue
        ok = (line ~ /Write access/ && line ~ /SM80_CP_ASYNC_CACHEALWAYS<[ ]*float[ ]*,[ ]*float[ ]*>/) || \
             (line ~ /Read access/ && line ~ /copy_if/)
        if (!ok) kn = 0
        if (tolower(line) !~ /nvjet|cublas/) ext = 0
      }
      if (blk !~ /SM80_CP_ASYNC_CACHEALWAYS/ || blk !~ /copy_if/) kn = 0
      h = n > 1 ? n - 1 : 1  # reports: one per access pair ("between A" ... "and B")
      instances += hazards(blk)
      if (kn) known += h
      else if (ext) external += h
      else { errors += h; print blk "\n" > findings }
      pairs += h; blocks++; blk = ""
    }
    function hazards(s,   t, m, total) {
      total = 0; t = s
      while (match(t, /\[[0-9]+ hazards?\]/)) { m = substr(t, RSTART + 1, RLENGTH - 2); sub(/ .*/, "", m); total += m; t = substr(t, RSTART + RLENGTH) }
      return total > 0 ? total : 1
    }
    { sub(/^\[[0-9]+\] /, "") }
    tool == "racecheck" && /Race reported between/ { flush(); blk = $0; next }
    tool == "racecheck" && blk != "" && /=========[ \t]+and (Read|Write) access/ { blk = blk "\n" $0; next }
    { flush() }
    tool == "racecheck" && /RACECHECK SUMMARY:/ { summaries++; if (match($0, /[0-9]+ hazards? displayed/)) displayed += substr($0, RSTART, RLENGTH) + 0 }
    tool != "racecheck" && /ERROR SUMMARY:/ { summaries++; if (match($0, /[0-9]+ errors?/)) errors += substr($0, RSTART, RLENGTH) + 0 }
    END {
      flush()
      seen = pairs > blocks ? pairs : blocks
      if (tool == "racecheck" && displayed > seen) { errors += displayed - seen; print "unparsed racecheck reports: " displayed - seen > findings }
      printf "%d %d %d %d %d\n", errors, known, external, summaries, instances
    }' "$1"
}
fail=0
json_steps=""
declare -A T_ERR T_KNOWN T_EXT T_BAD F_ERR F_KNOWN F_EXT F_STEPS F_BAD
for step in "${STEPS[@]}"; do
  IFS='|' read -r tool fam case np env cmd <<< "$step"
  name="$tool.$fam.$case"
  log="$OUT/$name.log"
  st=$(cat "$OUT/$name.status" 2>/dev/null || echo "status=not_run reason=unknown")
  status=$(echo "$st" | sed -E 's/.*status=([a-z_]+).*/\1/')
  rc=$(echo "$st" | sed -nE 's/.*rc=([0-9]+).*/\1/p')
  secs=$(echo "$st" | sed -nE 's/.*seconds=([0-9]+).*/\1/p')
  read -r e k x s inst < <(if [ -f "$log" ]; then classify "$log" "$tool"; else echo "0 0 0 0 0"; fi)
  procs=$(( np > 0 ? np : 1 ))
  outcome=ok
  if [ "$status" = not_run ]; then outcome=not_run
  elif [ "${rc:-1}" = 124 ] || [ "${rc:-1}" = 137 ]; then outcome=not_finished
  elif [ "$s" -lt "$procs" ]; then outcome=not_finished  # a process ended without the tool's summary
  elif [ "${rc:-1}" != 0 ]; then outcome=test_failed
  fi
  [ "$outcome" != ok ] && { fail=1; F_BAD[$tool.$fam]=$(( ${F_BAD[$tool.$fam]:-0} + 1 )); T_BAD[$tool]=$(( ${T_BAD[$tool]:-0} + 1 )); }
  [ "$e" -gt 0 ] && fail=1
  T_ERR[$tool]=$(( ${T_ERR[$tool]:-0} + e )); T_KNOWN[$tool]=$(( ${T_KNOWN[$tool]:-0} + k )); T_EXT[$tool]=$(( ${T_EXT[$tool]:-0} + x ))
  F_ERR[$tool.$fam]=$(( ${F_ERR[$tool.$fam]:-0} + e )); F_KNOWN[$tool.$fam]=$(( ${F_KNOWN[$tool.$fam]:-0} + k ))
  F_EXT[$tool.$fam]=$(( ${F_EXT[$tool.$fam]:-0} + x )); F_STEPS[$tool.$fam]=$(( ${F_STEPS[$tool.$fam]:-0} + 1 ))
  printf '  %-46s %-12s errors %-4s known %-6s external %-6s %ss\n' "$name" "$outcome" "$e" "$k" "$x" "${secs:--}"
  [ "$e" -gt 0 ] && [ -f "$log.findings" ] && { echo "    first findings ($log):"; head -20 "$log.findings" | sed 's/^/      /'; }
  [ "$outcome" = test_failed ] && { echo "    test failed under the tool (rc $rc), last lines of $log:"; tail -8 "$log" | sed 's/^/      /'; }
  json_steps+="${json_steps:+,}
    {\"tool\": \"$tool\", \"family\": \"$fam\", \"case\": \"$case\", \"pes\": $np, \"outcome\": \"$outcome\", \"rc\": ${rc:-null}, \"seconds\": ${secs:-null}, \"errors\": $e, \"known\": $k, \"external\": $x, \"hazard_instances\": $inst}"
done

echo "== compute-sanitizer summary ($elapsed s of a ${BUDGET} s budget; per family: errors, then [known / external] where any)"
for tool in "${TOOLS[@]}"; do
  parts=""
  for fam in $FAMILIES; do
    key=$tool.$fam
    [ -n "${F_STEPS[$key]:-}" ] || continue
    p="$fam ${F_ERR[$key]}"
    [ "${F_KNOWN[$key]}" -gt 0 ] || [ "${F_EXT[$key]}" -gt 0 ] && p+=" [known ${F_KNOWN[$key]} / external ${F_EXT[$key]}]"
    [ "${F_BAD[$key]:-0}" -gt 0 ] && p+=" (${F_BAD[$key]} of ${F_STEPS[$key]} steps not finished or failed)"
    parts+="${parts:+, }$p"
  done
  what=errors; [ "$tool" = racecheck ] && what="hazards in epkit"
  line="$tool: ${T_ERR[$tool]:-0} $what"
  [ "$tool" = racecheck ] && line+=", ${T_KNOWN[$tool]:-0} known (CUTLASS blockwise scales: cp.async ordered by an mbarrier, docs/RELIABILITY.md), ${T_EXT[$tool]:-0} external (cuBLASLt, not analysed)"
  [ "${T_BAD[$tool]:-0}" -gt 0 ] && line+="; ${T_BAD[$tool]} steps NOT clean runs (see above)"
  echo "$line -- $parts"
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
commit=$(cat "$BUILD/generated/commit.txt" 2>/dev/null || echo unknown)  # the build's stamp
cat > "$OUT/summary.json" <<EOF
{
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "commit": "$commit",
  "gpu": "$gpu",
  "sanitizer": "$("$SAN" --version 2>/dev/null | grep -i version | head -1 | sed 's/"/\\"/g')",
  "budget_s": $BUDGET,
  "elapsed_s": $elapsed,
  "steps": [$json_steps
  ]
}
EOF
echo "== sanitize: $([ $fail = 0 ] && echo clean || echo 'NOT clean'); report $OUT/summary.json"
exit $fail
