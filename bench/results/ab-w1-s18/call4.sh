#!/bin/bash
# Session 18, device call 4: the landing tree. The MoE layer at W = 1 on the general kernels
# (EPKIT_LOCAL_KERNELS=0), the tree's libepkit.so against main before the session (`base`, a86f625,
# whose layer code is the same): the decode grids are larger now, and the layer's shared expert runs
# beside them on its own stream (docs/MOE.md), so this checks that nothing there got slower. First
# the GPU suite on the landing tree.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
(cd build-gpu && timeout 200 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|Total Test" $W/gpu-suite.log | tail -n 14
nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' build-gpu/CMakeCache.txt)
dep="$PWD/build-gpu/src/moe${nvlib:+:$(dirname "$nvlib")}"
for r in 1 2; do
  [ $(( $(date +%s) - t0 )) -lt 330 ] || break  # the session's device time
  for t in tip base; do
    if [ $t = tip ]; then lib="$PWD/build-gpu/src"; else lib="$PWD/.ab/lib/base"; fi
    EPKIT_LOCAL_KERNELS=0 LD_LIBRARY_PATH="$lib:$dep" timeout 90 build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-moe layer \
      --experts 256 --batches 1,4,16 --schedules none --json $W/layer-$t-$r.json > $W/layer-$t-$r.log 2>&1
    echo "layer $t round $r rc=$? t=$(( $(date +%s) - t0 ))"
  done
done
python3 - $W <<'PY'
import json, sys, statistics
w = sys.argv[1]
rows = {}
for t in ("tip", "base"):
    for r in (1, 2):
        try:
            d = json.load(open(f"{w}/layer-{t}-{r}.json"))
        except Exception as e:
            print(t, r, "no json:", e); continue
        for x in d["rows"]:
            if x.get("kernel") != "moe_layer": continue
            k = (t, x["batch"], x.get("shared"), x.get("layout"))
            rows.setdefault(k, []).append((x["us_median"], x.get("graph_us_median")))
for k in sorted(rows, key=lambda k: (k[1], str(k[2]), str(k[3]), k[0])):
    v = rows[k]
    print(k, "event-timed", [round(a, 1) for a, _ in v], "graph", [round(b, 1) if b else None for _, b in v])
PY
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
