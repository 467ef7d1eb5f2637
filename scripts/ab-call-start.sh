#!/usr/bin/env bash
# The common start of an A/B device call (sourced by bench/results/ab-*/callN.sh, from the repository
# root on the GPU machine): the box's environment, the carried libraries unpacked, and the build.
#   source scripts/ab-call-start.sh LOGDIR
# Sets W (LOGDIR, created) and t0, and exports EPKIT_COMMIT from .ab/commit; end the call with
# `source scripts/ab-call-end.sh [make-test|gpu-suite]`. The call carries
# [".deps/wheels", ".deps/googletest", ".ab"]; .ab/libs.tar.xz holds the libraries of
# `scripts/bench-ab.sh prepare-lib`.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
unset EPKIT_TIMEOUT_MS  # the tests set their own bounds
[ -f .ab/commit ] && export EPKIT_COMMIT=$(cat .ab/commit)
W=${1:?usage: source scripts/ab-call-start.sh LOGDIR}
mkdir -p "$W"
t0=$(date +%s)
if [ -f .ab/libs.tar.xz ]; then (cd .ab && tar xJf libs.tar.xz && rm libs.tar.xz); fi
TAIL=3 scripts/gpu-session.sh "$W/s" build
echo "build t=$(( $(date +%s) - t0 ))"
