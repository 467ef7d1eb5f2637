"""epkit: expert-parallel MoE dispatch/combine over NVSHMEM for PyTorch.

Two APIs over one implementation:

* ``epkit.AllToAll`` + ``epkit.AllToAllConfig``: the native API, with the C++ class's names: keyword
  names of the C++ config, returned outputs, split send/recv halves, and the expert-packed layout
  (``layout="packed"``).
* ``epkit.pplx``: the pplx-kernels API (``import epkit.pplx as pplx_kernels``): ``AllToAll`` with
  ``internode``/``intranode``/``dispatch``/``combine``/``destroy`` and the ``nvshmem_*`` helpers.
* ``epkit.MoELayer`` (router to combine, plus the shared expert) and the expert-compute kernels as
  functional ops: ``route``, ``quantize``, ``quantize_weights``, ``grouped_gemm``,
  ``silu_mul_quantize`` (epkit.moe; torch custom ops ``epkit::moe_*`` under torch.compile).

Errors from the library raise ``epkit.EpkitError`` (a RuntimeError) with the C++ message.
"""

from ._lib import NVSHMEM_HOST_PATH, EpkitError, _C
from .all_to_all import AllToAll, DispatchOutput
from .config import AllToAllConfig
from .moe import (
    ErrorRecord,
    GateProjection,
    GroupedGemm,
    Quantized,
    QuantizedWeights,
    RouterConfig,
    Routing,
    available_gemm_configs,
    choose_gemm_config,
    grouped_gemm,
    quantize,
    quantize_weights,
    route,
    silu_mul_quantize,
)
from .moe import check as check_moe_errors
from .moe_layer import LayerRouting, MoELayer, MoELayerConfig
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
    nvshmem_maps_peer,
    nvshmem_my_pe,
    nvshmem_n_pes,
    nvshmem_unique_id_size,
)

from . import pplx  # noqa: E402  (epkit.pplx: the pplx-kernels compatible API)

DType = _C.DType
DataPath = _C.DataPath
ExpertLayout = _C.ExpertLayout
RouterMode = _C.RouterMode
MoESchedule = _C.MoESchedule

__version__ = _C.__version__  # VERSION, stamped into the extension at build time
git_commit = _C.git_commit  # the commit the extension was built from ("+dirty" when tracked files differed)

__all__ = [
    "AllToAll",
    "AllToAllConfig",
    "DataPath",
    "DispatchOutput",
    "DType",
    "ExpertLayout",
    "EpkitError",
    "ErrorRecord",
    "GateProjection",
    "GroupedGemm",
    "LayerRouting",
    "MoELayer",
    "MoELayerConfig",
    "MoESchedule",
    "Quantized",
    "QuantizedWeights",
    "RouterConfig",
    "RouterMode",
    "Routing",
    "available_gemm_configs",
    "check_moe_errors",
    "choose_gemm_config",
    "grouped_gemm",
    "quantize",
    "quantize_weights",
    "route",
    "silu_mul_quantize",
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
    "nvshmem_maps_peer",
    "nvshmem_my_pe",
    "nvshmem_n_pes",
    "nvshmem_unique_id_size",
]
