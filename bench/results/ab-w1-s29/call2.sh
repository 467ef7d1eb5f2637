#!/bin/bash
# Session 29, device call 2, run in session 30: combine's decode kernel (the tip: the small P2P
# combine compiled for tagged objects of at most 32 ranks, 3,520 SASS instructions against 6,776) against
# - "base": the tree before it (2cd7fde without flags, the same kernels as a41e2fc);
# - "nog2": the tip with -DEPKIT_AB_NOG2 (2,648: the decode kernel without the G = 2 copy, its calls
#   on G = 1), to see what the G = 2 copy costs at 1-4 tokens and what it gives at 128.
# (Session 29 ended before a machine came; session 30 started without .ab, so call 1's "compact"
# library was not rebuilt: call 1 measured it.)
# Then the GPU suite on the tip (W = 1, 2, 4, 8 on one GPU), and ncu with application replay of the
# tip's fused 1-token general kernels (call 1's ncu step asked for --iters 50, below the bench's
# minimum of 200, and did not run).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ab_libs general 9 150 "base nog2" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_gpu_suite 200
ab_ncu app build-gpu/src 120 --replay-mode application --section WarpStateStats --section SourceCounters \
  --warp-sampling-interval 0 --launch-skip 30 --launch-count 4 -- --preset decode --tokens 1 --no-baselines --iters 200
source scripts/ab-call-end.sh
