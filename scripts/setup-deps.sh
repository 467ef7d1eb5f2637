#!/usr/bin/env bash
# Installs what the build needs and the machine lacks, into the project (.deps/), idempotently.
# - NVSHMEM: pinned wheel nvidia-nvshmem-cu13==3.4.5 (the version docs/PERF.md was measured with),
#   unless NVSHMEM_HOME or python3's nvidia.nvshmem already provides it.
# - GoogleTest: Debian's googletest sources (apt) where apt works; a copy goes to .deps/googletest so
#   machines without apt can build it from a copied tree.
# - CUTLASS headers: the pinned PyPI package nvidia-cutlass==4.2.0.0 (headers under
#   cutlass_library/source/include), installed with --no-deps into .deps/cutlass-py. Its wheel is
#   kept in .deps/wheels/ so that a machine without a registry installs it from there.
set -euo pipefail
cd "$(dirname "$0")/.."
NVSHMEM_PIN="nvidia-nvshmem-cu13==3.4.5"
mkdir -p .deps

have_nvshmem() {
  [ -n "${NVSHMEM_HOME:-}" ] && [ -f "$NVSHMEM_HOME/include/nvshmem.h" ] && return 0
  python3 -c "import nvidia.nvshmem as m, os, sys; sys.exit(0 if os.path.exists(os.path.join(m.__path__[0],'lib','libnvshmem_device.a')) else 1)" 2>/dev/null && return 0
  [ -f .deps/nvshmem/lib/libnvshmem_device.a ] && return 0
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
CUTLASS_PIN="nvidia-cutlass==4.2.0.0"
CUTLASS_WHEEL=".deps/wheels/nvidia_cutlass-4.2.0.0-py3-none-any.whl"
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
  echo "[deps] installing nanobind==2.9.2"
  python3 -m pip install -q "nanobind==2.9.2" >/dev/null 2>&1 || echo "[deps] nanobind unavailable: the Python extension will not be built"
fi
echo "[deps] ok"
