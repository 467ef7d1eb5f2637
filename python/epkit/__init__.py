"""epkit: expert-parallel MoE dispatch/combine over NVSHMEM for PyTorch.

Two APIs over one implementation:

* ``epkit.AllToAll`` with ``internode``/``intranode``/``dispatch``/``combine``/``destroy`` and the
  ``nvshmem_*`` helpers: the pplx-kernels API (``import epkit as pplx_kernels`` style ports).
* ``epkit.ExpertAllToAll`` + ``epkit.AllToAllConfig``: keyword names of the C++ config, returned
  outputs, split send/recv halves, and the expert-packed layout (``layout="packed"``).

Errors from the library raise ``epkit.EpkitError`` (a RuntimeError) with the C++ message.
"""

from ._lib import NVSHMEM_HOST_PATH, EpkitError, _C
from .all_to_all import DispatchOutput, ExpertAllToAll
from .compat import AllToAll
from .config import AllToAllConfig
from .nvshmem import (
    nvshmem_alloc_empty_unique_id,
    nvshmem_alltoall,
    nvshmem_barrier_all,
    nvshmem_barrier_all_on_current_stream,
    nvshmem_collectives_supported,
    nvshmem_finalize,
    nvshmem_get_unique_id,
    nvshmem_init,
    nvshmem_initialized,
    nvshmem_malloc,
    nvshmem_my_pe,
    nvshmem_n_pes,
    nvshmem_unique_id_size,
)

DType = _C.DType
DataPath = _C.DataPath
ExpertLayout = _C.ExpertLayout

__version__ = "0.1.0"

__all__ = [
    "AllToAll",
    "AllToAllConfig",
    "DataPath",
    "DispatchOutput",
    "DType",
    "ExpertLayout",
    "EpkitError",
    "ExpertAllToAll",
    "nvshmem_alloc_empty_unique_id",
    "nvshmem_alltoall",
    "nvshmem_barrier_all",
    "nvshmem_barrier_all_on_current_stream",
    "nvshmem_collectives_supported",
    "nvshmem_finalize",
    "nvshmem_get_unique_id",
    "nvshmem_init",
    "nvshmem_initialized",
    "nvshmem_malloc",
    "nvshmem_my_pe",
    "nvshmem_n_pes",
    "nvshmem_unique_id_size",
]
