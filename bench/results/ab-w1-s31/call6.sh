#!/bin/bash
# Session 31, device call 6: does the receivers' polling slow the decode sender? The tip (the lean
# send half) against builds whose spinning waits sleep 100 ns ("s100") or 400 ns ("s400") before each
# reload (-DEPKIT_SPIN_SLEEP_NS on dispatch.cu and combine.cu), general kernels at W = 1,
# V3 and V2-Lite at 1 and 4 tokens (5 rounds: the session had 4 device-minutes left). V3's receive blocks spin 257 threads each on the count words
# (32 blocks), V2-Lite's 65 (6 blocks); only V3 kept its dispatch time with the lean send half.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c6
ab_libs general 5 120 "s100 s400" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
source scripts/ab-call-end.sh
