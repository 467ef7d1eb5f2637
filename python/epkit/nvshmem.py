"""NVSHMEM helpers with the names and signatures of pplx-kernels' Python API.

One NVSHMEM instance lives in each process: nvshmem_init creates it (on the current CUDA device),
nvshmem_finalize releases it. Every function here that says "collective" must be called by every PE,
in the same order.
"""

import math
import operator

import torch

from ._lib import EpkitError, _C

__all__ = [
    "nvshmem_get_unique_id",
    "nvshmem_alloc_empty_unique_id",
    "nvshmem_unique_id_size",
    "nvshmem_init",
    "nvshmem_finalize",
    "nvshmem_initialized",
    "nvshmem_my_pe",
    "nvshmem_n_pes",
    "nvshmem_malloc",
    "nvshmem_barrier_all",
    "nvshmem_barrier_all_on_current_stream",
    "nvshmem_alltoall",
    "nvshmem_collectives_supported",
    "nvshmem_maps_peer",
]


def nvshmem_get_unique_id() -> torch.Tensor:
    """A fresh unique id as a CPU uint8 tensor [128]; make it on one rank and broadcast it."""
    return torch.frombuffer(bytearray(_C.make_unique_id()), dtype=torch.uint8)


def nvshmem_unique_id_size() -> int:
    return _C.unique_id_size()


def nvshmem_alloc_empty_unique_id() -> torch.Tensor:
    """A zeroed uint8 tensor [128] to receive the id (e.g. by torch.distributed.broadcast)."""
    return torch.zeros(_C.unique_id_size(), dtype=torch.uint8)


def nvshmem_init(uid: torch.Tensor, rank: int, world_size: int) -> None:
    """Bootstraps NVSHMEM as PE `rank` of `world_size` on the current CUDA device. Collective."""
    if not isinstance(uid, torch.Tensor) or uid.dtype != torch.uint8 or uid.numel() != _C.unique_id_size():
        raise EpkitError(f"uid must be a uint8 tensor of {_C.unique_id_size()} elements (from "
                         f"nvshmem_get_unique_id), got {getattr(uid, 'dtype', type(uid))} "
                         f"{tuple(getattr(uid, 'shape', ()))}")
    if not 0 <= rank < world_size:
        raise EpkitError(f"rank {rank} is outside [0, world_size={world_size})")
    _C.init(bytes(uid.detach().cpu().contiguous().tolist()), int(rank), int(world_size))


def nvshmem_finalize() -> None:
    """Destroys AllToAll objects never destroyed, then finalizes NVSHMEM. Collective; a no-op if not initialized."""
    _C.finalize()


def nvshmem_initialized() -> bool:
    return _C.initialized()


def nvshmem_my_pe() -> int:
    return _C.my_pe()


def nvshmem_n_pes() -> int:
    return _C.n_pes()


def _stream() -> int:
    return torch.cuda.current_stream(_C.device()).cuda_stream


def nvshmem_malloc(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized tensor on the symmetric heap. Collective (same shape and dtype on every PE).

    The memory is freed when the tensor and all its views are gone; that free is collective too, so
    drop such tensors at the same point on every PE (or keep them until nvshmem_finalize).
    """
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)))
    device = torch.device(device)
    if device.type != "cuda" or (device.index is not None and device.index != _C.device()):
        raise EpkitError(f"nvshmem_malloc: device {device} is not this PE's GPU cuda:{_C.device()}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.from_dlpack(_C.symmetric_malloc(math.prod(shape) * itemsize))
    return raw.view(dtype).view(shape)


def nvshmem_barrier_all() -> None:
    """Host-side barrier over all PEs (not for CUDA graph capture)."""
    _C.barrier_all()


def nvshmem_barrier_all_on_current_stream() -> None:
    """A barrier over all PEs, enqueued on the current CUDA stream."""
    _C.barrier_all_on_stream(_stream())


def nvshmem_maps_peer(pe: int) -> bool:
    """Whether this PE reaches PE `pe`'s symmetric heap with plain loads and stores (NVLink or PCIe
    peer access, or the same GPU: nvshmem_ptr is non-null), as epkit's NVLink path does; False for
    a peer reached only through the network (put with signal). Not collective. (An epkit extra.)"""
    try:
        if isinstance(pe, bool):
            raise TypeError
        pe = operator.index(pe)  # ints and integer scalars (numpy, 0-d tensors) alike
    except TypeError:
        raise EpkitError(f"pe must be an int, got {type(pe).__name__}") from None
    return _C.maps_peer(pe)


def nvshmem_collectives_supported() -> bool:
    """False where several PEs share a GPU without MPS (NVSHMEM's "limited MPG" mode): NVSHMEM's own
    collectives, nvshmem_alltoall here, would end the process, so epkit raises instead. The same on
    every PE. (An epkit extra; pplx-kernels has no such call.)"""
    return _C.collectives_supported()


def nvshmem_alltoall(dest: torch.Tensor, source: torch.Tensor) -> None:
    """Dense all-to-all between symmetric tensors on the current stream: PE p's block i of `source`
    lands in block p of PE i's `dest`; blocks are numel / n_pes elements. Collective.

    Raises EpkitError, on every PE, where nvshmem_collectives_supported() is False."""
    n = _C.n_pes()
    if not _C.collectives_supported():
        raise EpkitError(f"nvshmem_alltoall is not supported here: the {n} PEs run with several PEs on one GPU "
                         "and no MPS (NVSHMEM's \"limited MPG\" mode), where NVSHMEM's collectives end the process; "
                         "run one PE per GPU (or under MPS). epkit.AllToAll and the barriers work in this mode.")
    for name, t in (("dest", dest), ("source", source)):
        if not t.is_contiguous():
            raise EpkitError(f"nvshmem_alltoall: {name} must be contiguous")
    nbytes = source.numel() * source.element_size()
    if dest.numel() * dest.element_size() != nbytes or nbytes % n:
        raise EpkitError(f"nvshmem_alltoall: dest ({dest.numel() * dest.element_size()} bytes) and source "
                         f"({nbytes} bytes) must be the same size, a multiple of n_pes={n}")
    _C.alltoall(dest.data_ptr(), source.data_ptr(), nbytes // n, _stream())
