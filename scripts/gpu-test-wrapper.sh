#!/usr/bin/env bash
# Runs one GPU test binary as NP processes under epkit-run; exits 77 (skipped) loudly with no GPU.
set -u
launcher=$1; np=$2; shift 2
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -z "$ngpu" ] || [ "$ngpu" -eq 0 ]; then
  echo "skipped: no GPU ($(basename "$1") needs $np processes on CUDA GPUs)"
  exit 77
fi
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
exec "$launcher" -n "$np" -- "$@"
