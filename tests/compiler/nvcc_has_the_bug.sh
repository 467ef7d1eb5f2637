#!/usr/bin/env bash
# Does this nvcc miscompile grid_constant_copy.cu? Looks at the PTX (no GPU needed): the right code
# reads %tid.x (the copy's gw); the miscompiled one loads it from the parameter instead.
# Exit 0: this nvcc compiles it right; 1: it has the bug (epkit's kernels avoid the pattern either way).
set -euo pipefail
NVCC=${NVCC:-nvcc}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$NVCC" -O3 -arch=sm_90a -std=c++17 -ptx "$(dirname "$0")/grid_constant_copy.cu" -o "$d/k.ptx"
if grep -q '%tid.x' "$d/k.ptx"; then
  echo "$("$NVCC" --version | tail -n 1): right"
  exit 0
fi
echo "$("$NVCC" --version | tail -n 1): MISCOMPILES a copy of an object built from a __grid_constant__ parameter"
exit 1
