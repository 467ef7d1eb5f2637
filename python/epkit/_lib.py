"""Loads the compiled extension, making NVSHMEM's host library findable first.

libepkit.so needs libnvshmem_host.so.3. If the process already has one (torch's CUDA wheels load
the nvidia-nvshmem wheel's at import), that copy is used. Otherwise it is preloaded from
``NVSHMEM_HOME`` or the installed ``nvidia.nvshmem``, which covers virtual environments and moved
installs beyond libepkit.so's rpath. The host library must be the NVSHMEM version epkit was built
against (its device half is linked into libepkit.so).
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


def _loaded_nvshmem():
    """The path of a libnvshmem_host already in this process (torch's CUDA wheels load one), if any:
    a second copy from elsewhere would be a second NVSHMEM, and libepkit.so binds to the first
    by soname anyway."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if _NVSHMEM_HOST in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def _preload_nvshmem():
    loaded = _loaded_nvshmem()
    if loaded:
        return loaded
    for d in _nvshmem_dirs():
        path = os.path.join(d, _NVSHMEM_HOST)
        if os.path.exists(path):
            # RTLD_GLOBAL so NVSHMEM's own plugins, loaded later, resolve against this copy.
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
    return None


NVSHMEM_HOST_PATH = _preload_nvshmem()


def _promote_cxx_runtime():
    """Puts the process's C++ runtime (already loaded by torch) in the global symbol scope before
    the extension loads. Python loads extensions RTLD_LOCAL; without this, symbols the extension
    takes from libstdc++ (stream inserters, locale facets) bind to a same-named definition in a
    library earlier in its own search order. A library built by a toolchain that links libstdc++
    statically exports that copy, and the first error message with a number in it crashed inside
    its uninitialised std::ostream. epkit's libraries link with --exclude-libs for the C++ runtime
    (963 exported std symbols before, 30 after, on such a toolchain); this stays for libraries
    built by other toolchains."""
    for name in ("libstdc++.so.6", "libgcc_s.so.1"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass


_promote_cxx_runtime()


def _host_nvshmem_version(path):
    """(major, minor, patch) of the libnvshmem_host.so.3 at `path` (or loaded by soname), or None."""
    try:
        lib = ctypes.CDLL(path or _NVSHMEM_HOST)
        v = [ctypes.c_int(-1) for _ in range(3)]
        lib.nvshmemx_vendor_get_version_info(*(ctypes.byref(x) for x in v))
        return tuple(x.value for x in v)
    except (OSError, AttributeError):
        return None


try:
    from . import _C  # noqa: E402
except ImportError as _e:
    # A host library of another NVSHMEM release can lack a symbol the extension binds at load (-z now).
    _v = _host_nvshmem_version(NVSHMEM_HOST_PATH)
    raise ImportError(f"{_e}\nepkit's extension did not load. The NVSHMEM host library in this process is "
                      f"{NVSHMEM_HOST_PATH or _NVSHMEM_HOST} (NVSHMEM {'.'.join(map(str, _v)) if _v else 'unknown'}); "
                      "epkit links NVSHMEM's device half of the release it was built against, and needs that "
                      "release's host library (or a later minor of the same major): see pyproject.toml's "
                      "nvidia-nvshmem pin, NVSHMEM_HOME, or LD_PRELOAD the matching libnvshmem_host.so.3.") from _e

EpkitError = _C.EpkitError
EpkitError.__module__ = "epkit"  # shown in tracebacks as epkit.EpkitError

# NVSHMEM's host library against the device half linked into libepkit_comm.so, checked at import. A
# pair that cannot work together is reported here (the world-size-1 path, which needs no NVSHMEM,
# still works) and raised as EpkitError by every NVSHMEM bootstrap (nvshmem_init,
# nvshmem_get_unique_id, pplx intranode, deep_ep.Buffer), before NVSHMEM is touched.
NVSHMEM_VERSIONS = _C.nvshmem_versions()  # (device (M, m, p), host (M, m, p), host library path, problem)
if NVSHMEM_VERSIONS[3]:
    import warnings

    warnings.warn(NVSHMEM_VERSIONS[3], RuntimeWarning, stacklevel=2)
