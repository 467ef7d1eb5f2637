#!/bin/bash
# Session 19, device call 1 (issue 15, EP2 goal). The general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0),
# libraries built on the CPU machine from the tree (85d4dd6):
#   tipx    the tree: combine's barrier flags at combine_send's start (by block 0's last warp), num_msgs
#           loaded before the weights' stores
#   lateb   -DEPKIT_AB_LATE_BARRIER: the flags after the partials, by block 0's warp 0, as before
#   laten   -DEPKIT_AB_LATE_NMSG: num_msgs loaded after the weights' stores, as before
#   old     both: main's combine (288f87e)
#   stages  the tree with -DEPKIT_STAGE_TIMERS
# Then the same pair with --weights-at-dispatch (what the layer now runs), a 128-token object's 1-token
# call, the stamps, the GPU suite (W = 1..8, several PEs on the GPU), and the MoE layer A/B: the
# router weights at dispatch (the tree) against at combine (EPKIT_AB_LAYER_WEIGHTS_AT_COMBINE=1), on
# the local (W = 1) kernels and on the general ones.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="tipx lateb laten old" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="old" timeout 60 scripts/bench-ab.sh run-libs $W/wad build-gpu --reps 2 -- \
  "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$?"
sed -n '/median over/,$p' $W/wad.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="old" timeout 60 scripts/bench-ab.sh run-libs $W/m128 build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1 --max-tokens 128 --no-baselines > $W/m128.txt 2>&1; echo "m128 rc=$?"
sed -n '/median over/,$p' $W/m128.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log | head -n 8
echo "stamps t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 200 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|Total Test" $W/gpu-suite.log | tail -n 14
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "suite t=$(( $(date +%s) - t0 ))"
nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' build-gpu/CMakeCache.txt)
export LD_LIBRARY_PATH="$PWD/build-gpu/src:$PWD/build-gpu/src/moe${nvlib:+:$(dirname "$nvlib")}"
for r in 1 2; do
  for lk in 1 0; do
    for wc in 0 1; do
      [ $(( $(date +%s) - t0 )) -lt 545 ] || break 3  # the call's limit
      EPKIT_LOCAL_KERNELS=$lk EPKIT_AB_LAYER_WEIGHTS_AT_COMBINE=$wc timeout 40 build-gpu/bin/epkit-run -n 1 -- \
        build-gpu/bin/epkit-moe layer --experts 256 --batches 1,4,16 --schedules none \
        --json $W/layer-lk$lk-wc$wc-$r.json > $W/layer-lk$lk-wc$wc-$r.log 2>&1
      echo "layer local=$lk weights_at_combine=$wc round $r rc=$? t=$(( $(date +%s) - t0 ))"
    done
  done
done
python3 - $W <<'PY'
import json, sys, glob, re
w = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{w}/layer-lk*-wc*-*.json")):
    lk, wc, r = re.search(r"lk(\d)-wc(\d)-(\d)", f).groups()
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "no json:", e); continue
    for x in d["rows"]:
        if x.get("kernel") != "moe_layer": continue
        k = (f"local={lk}", x["batch"], x.get("shared"), x.get("layout"), f"wc={wc}")
        rows.setdefault(k, []).append((x["us_median"], x.get("graph_us_median")))
for k in sorted(rows, key=lambda k: (k[0], k[1], str(k[2]), str(k[3]), k[4])):
    v = rows[k]
    print(k, "event-timed", [round(a, 1) for a, _ in v], "graph", [round(b, 1) if b else None for _, b in v])
PY
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
