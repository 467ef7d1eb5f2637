"""Loads the compiled extension, making NVSHMEM's host library findable first.

libepkit.so needs libnvshmem_host.so.3. Its rpath covers the nvidia-nvshmem wheel beside this
package and the NVSHMEM it was built against; preloading from the installed ``nvidia.nvshmem``
(or ``NVSHMEM_HOME``) also covers virtual environments and moved installs, and guarantees that the
process uses one copy of NVSHMEM whatever torch loads later.
"""

import ctypes
import os

# torch first: it loads the CUDA runtime that the extension then shares (same soname), rather than a
# second copy from the toolkit.
import torch  # noqa: F401

_NVSHMEM_HOST = "libnvshmem_host.so.3"


def _nvshmem_dirs():
    home = os.environ.get("NVSHMEM_HOME")
    if home:
        yield os.path.join(home, "lib")
    try:
        import nvidia.nvshmem as pkg
    except ImportError:
        return
    for root in pkg.__path__:
        yield os.path.join(root, "lib")


def _preload_nvshmem():
    for d in _nvshmem_dirs():
        path = os.path.join(d, _NVSHMEM_HOST)
        if os.path.exists(path):
            # RTLD_GLOBAL so NVSHMEM's own plugins, loaded later, resolve against this copy.
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
    return None


NVSHMEM_HOST_PATH = _preload_nvshmem()

from . import _C  # noqa: E402

EpkitError = _C.EpkitError
EpkitError.__module__ = "epkit"  # shown in tracebacks as epkit.EpkitError
