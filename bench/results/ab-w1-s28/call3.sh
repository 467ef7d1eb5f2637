#!/bin/bash
# Session 28, device call 3: ncu warp sampling of the fused 1-token general kernels with
# --replay-mode application (each pass reruns the bench, so the sampled kernel follows its real
# predecessors and their caches, unlike kernel replay's restore). Question: does instruction fetch
# ("no instruction") cost the timed loop anything? Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ab_ncu app build-gpu/src 300 --replay-mode application --section WarpStateStats --section SourceCounters \
  --warp-sampling-interval 0 --launch-skip 30 --launch-count 4 -- --preset decode --tokens 1 --no-baselines --iters 200
source scripts/ab-call-end.sh
