#!/usr/bin/env bash
# Installs what the build needs and the machine lacks, into the project (.deps/), idempotently.
# The pins are cmake/pins.cmake's (the one place they are set; CMake checks NVSHMEM against it).
# - NVSHMEM: the pinned wheel nvidia-nvshmem-cu13, unless NVSHMEM_HOME or python3's nvidia.nvshmem
#   already provides the pinned release.
# - GoogleTest: Debian's googletest sources (apt) where apt works; a copy goes to .deps/googletest so
#   machines without apt can build it from a copied tree.
# - CUTLASS headers: the pinned PyPI package nvidia-cutlass (headers under
#   cutlass_library/source/include), installed with --no-deps into .deps/cutlass-py. Its wheel is
#   kept in .deps/wheels/ so that a machine without a registry installs it from there.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { sed -n "s/^set(EPKIT_PIN_$1 \"\([^\"]*\)\").*/\1/p" cmake/pins.cmake; }
NVSHMEM_VERSION=$(pin NVSHMEM)
CUTLASS_VERSION=$(pin CUTLASS)
NANOBIND_VERSION=$(pin NANOBIND)
[ -n "$NVSHMEM_VERSION" ] && [ -n "$CUTLASS_VERSION" ] && [ -n "$NANOBIND_VERSION" ] ||
  { echo "[deps] cannot read the pins from cmake/pins.cmake" >&2; exit 1; }
NVSHMEM_PIN="nvidia-nvshmem-cu13==$NVSHMEM_VERSION"
mkdir -p .deps

# The release of an NVSHMEM folder, from its version header ("3.4.5"), or nothing.
nvshmem_release() {
  local h="$1/include/non_abi/nvshmem_version.h"
  [ -f "$h" ] && [ -f "$1/lib/libnvshmem_device.a" ] || return 0
  for p in MAJOR MINOR PATCH; do sed -n "s/^#define NVSHMEM_VENDOR_${p}_VERSION \([0-9]*\).*/\1/p" "$h"; done | paste -sd.
}
have_nvshmem() {  # a candidate of CMake's search (cmake/NVSHMEM.cmake) holds the pinned release
  local py
  py=$(python3 -c "import nvidia.nvshmem as m; print(m.__path__[0])" 2>/dev/null || true)
  for d in "${NVSHMEM_HOME:-}" "$py" .deps/nvshmem; do
    [ -n "$d" ] && [ "$(nvshmem_release "$d")" = "$NVSHMEM_VERSION" ] && return 0
  done
  return 1
}
if ! have_nvshmem; then
  echo "[deps] installing $NVSHMEM_PIN into .deps/"
  python3 -m pip install -q --no-deps --target .deps/py "$NVSHMEM_PIN"
  ln -sfn "$(pwd)/.deps/py/nvidia/nvshmem" .deps/nvshmem
fi

if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  if [ ! -f /usr/src/googletest/CMakeLists.txt ] && command -v apt-get >/dev/null 2>&1; then
    echo "[deps] installing googletest (Debian)"
    (apt-get install -y -q googletest >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q googletest >/dev/null; })
  fi
  if [ -f /usr/src/googletest/CMakeLists.txt ]; then
    cp -r /usr/src/googletest .deps/googletest
  fi
fi
[ -f .deps/googletest/CMakeLists.txt ] || { echo "[deps] GoogleTest sources not found and apt unavailable" >&2; exit 1; }
CUTLASS_PIN="nvidia-cutlass==$CUTLASS_VERSION"
CUTLASS_WHEEL=".deps/wheels/nvidia_cutlass-$CUTLASS_VERSION-py3-none-any.whl"
if [ ! -f .deps/cutlass/include/cutlass/cutlass.h ]; then
  if [ ! -f "$CUTLASS_WHEEL" ]; then
    echo "[deps] downloading $CUTLASS_PIN into .deps/wheels/"
    python3 -m pip download -q --no-deps -d .deps/wheels "$CUTLASS_PIN"
  fi
  echo "[deps] installing $CUTLASS_PIN (headers) into .deps/cutlass-py"
  python3 -m pip install -q --no-deps --no-index --no-compile --target .deps/cutlass-py "$CUTLASS_WHEEL"
  ln -sfn cutlass-py/cutlass_library/source .deps/cutlass  # relative: the tree may move
fi
[ -f .deps/cutlass/include/cutlass/cutlass.h ] || { echo "[deps] CUTLASS headers not found after install" >&2; exit 1; }
# nanobind (pinned) for the Python extension; the build enables it wherever nanobind imports.
if ! python3 -c "import nanobind" >/dev/null 2>&1; then
  echo "[deps] installing nanobind==$NANOBIND_VERSION"
  python3 -m pip install -q "nanobind==$NANOBIND_VERSION" >/dev/null 2>&1 || echo "[deps] nanobind unavailable: the Python extension will not be built"
fi
echo "[deps] ok"
