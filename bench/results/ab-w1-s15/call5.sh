#!/bin/bash
# Session 15, device call 5 (issue 15): which steps of the 1-token local dispatch cost its time above
# the launch probe's kernel of the same shape. Diagnostic libraries built from the tip with
# diag.patch applied (never landed; each drops a step, so their outputs are wrong by design):
# ns (no scales loaded or stored), nm (no recv_map written), nc (no counts: block 0 returns after
# its stores), none (all three); tipx is the patched tree without flags (the tip's code). 3 rounds.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
EPKIT_AB_LIBS="tipx ns nm nc none" timeout 200 scripts/bench-ab.sh run-libs $W/diag build-gpu --reps 3 -- \
  --preset decode-v2lite,decode --tokens 1 --no-baselines > $W/diag.txt 2>&1; echo "diag rc=$?"
sed -n '/median over/,$p' $W/diag.txt
echo "diag t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c5.tgz -C $OUT c5 && rm -rf $W
