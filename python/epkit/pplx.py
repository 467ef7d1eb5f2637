"""epkit.pplx: the API of pplx-kernels' Python package (``import epkit.pplx as pplx_kernels``).

AllToAll here is the pplx-kernels class; epkit.AllToAll is the native one it wraps. The
``nvshmem_*`` helpers that pplx_kernels exports are re-exported here.

As in pplx-kernels, each call takes its dtypes from its tensors. What the constructor fixes is only
what sizes the symmetric buffers, the element size of the payload:

* hidden_dim_bytes // hidden_dim == 1: fp8 e4m3 with one fp32 scale per 128 elements
  (hidden_dim_scale_bytes >= ceil(hidden_dim / 128) * 4);
* == 2: bf16 or fp16, chosen by each dispatch's dp_x (copied as bytes, so both work).

combine takes expert_y and out_tokens in bf16 or fp16, each independently (expert_y fp32 only if the
AllToAll was created with combine_in_dtype=torch.float32). The C++ object is created, collectively,
in the constructor; no call creates anything, so any dtype set may first appear inside a CUDA graph
capture. Every rank must pass the same dp_x and out_tokens dtypes to one call (as with pplx-kernels).

intranode() takes the same path as internode() (NVSHMEM, with direct loads/stores to peers on the
same node). If NVSHMEM is not yet initialized it bootstraps it over the torch.distributed group
(group_name "default" is the world group), as pplx's intranode needs no NVSHMEM setup.
"""

import re
from typing import Optional

import torch

from ._lib import EpkitError, _C
from ._tensors import as_tensor, to_torch_dtype
from .all_to_all import AllToAll as _NativeAllToAll, DispatchOutput, _BOTH, _RECV, _SEND
from .config import AllToAllConfig
from .nvshmem import (  # noqa: F401  (re-exported: pplx_kernels' own helpers)
    nvshmem_alloc_empty_unique_id,
    nvshmem_alltoall,
    nvshmem_barrier_all,
    nvshmem_barrier_all_on_current_stream,
    nvshmem_finalize,
    nvshmem_get_unique_id,
    nvshmem_init,
    nvshmem_malloc,
    nvshmem_my_pe,
    nvshmem_n_pes,
    nvshmem_unique_id_size,
)

_SCALE_BLOCK = 128


def _mode(do_send: bool, do_recv: bool) -> int:
    if do_send and do_recv:
        return _BOTH
    if do_send:
        return _SEND
    if do_recv:
        return _RECV
    raise EpkitError("do_send and do_recv are both False: nothing to do")


# pplx-kernels' argument names for the native ones epkit's checks name in their messages: an error
# from the native layer is re-raised naming the argument the pplx caller passed (the native name after
# it in parentheses).
_PPLX_NAMES = {"x": "dp_x", "x_scale": "dp_x_scale", "topk_idx": "indices", "expert_x": "out_expert_x",
               "expert_x_scale": "out_expert_x_scale", "expert_num_tokens": "out_expert_num_tokens",
               "topk_weights": "weights", "num_tokens_device": "bound_m"}
_NAME_RE = re.compile(r"(?<![\w.(])(" + "|".join(sorted(_PPLX_NAMES, key=len, reverse=True)) + r")(?![\w(])")
_OUT_RE = re.compile(r"(?<![\w.(])out(?= has| is| data| must| given| \[)")


def _pplx_names(e: EpkitError) -> EpkitError:
    msg = _NAME_RE.sub(lambda m: f"{_PPLX_NAMES[m.group(1)]} ({m.group(1)})", str(e))
    msg = _OUT_RE.sub("out_tokens (out)", msg)
    return e if msg == str(e) else EpkitError(msg)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class AllToAll:
    """pplx-kernels compatible dispatch/combine. Create with internode() or intranode()."""

    def __init__(self, *, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                 hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, dispatch_dtype=None,
                 combine_in_dtype=None, combine_out_dtype=None, **extra):
        """dispatch_dtype= (optional) only confirms the payload's element size; combine_in_dtype=fp32
        makes combine take fp32 expert_y instead of bf16/fp16; combine_out_dtype= is the type of the
        partials a combine send half packs when it is given no out_tokens (pplx callers always give it)."""
        if hidden_dim <= 0 or hidden_dim_bytes < hidden_dim:
            raise EpkitError(f"hidden_dim_bytes={hidden_dim_bytes} is below hidden_dim={hidden_dim}")
        elem = hidden_dim_bytes // hidden_dim
        if elem == 1:
            need = (hidden_dim + _SCALE_BLOCK - 1) // _SCALE_BLOCK * 4
            if hidden_dim_scale_bytes < need:
                raise EpkitError(f"an fp8 payload carries one fp32 scale per {_SCALE_BLOCK} elements: "
                                 f"hidden_dim_scale_bytes={hidden_dim_scale_bytes} is below {need} for "
                                 f"hidden_dim={hidden_dim} (per-token or per-tensor scales are not supported)")
            payload = torch.float8_e4m3fn
        elif elem == 2:
            if hidden_dim_scale_bytes:
                raise EpkitError(f"16-bit payloads carry no scales in epkit, but hidden_dim_scale_bytes="
                                 f"{hidden_dim_scale_bytes}")
            payload = torch.bfloat16  # stands for "2 bytes": each dispatch may pass bf16 or fp16
        else:
            raise EpkitError(f"hidden_dim_bytes / hidden_dim = {hidden_dim_bytes / hidden_dim:g}: the payload "
                             "must be 1 byte (fp8 e4m3) or 2 bytes (bf16, fp16) per element")
        if dispatch_dtype is not None:
            dispatch_dtype = to_torch_dtype(dispatch_dtype)
            if _element_size(dispatch_dtype) != elem:
                raise EpkitError(f"dispatch_dtype {dispatch_dtype} has {_element_size(dispatch_dtype)}-byte "
                                 f"elements but hidden_dim_bytes / hidden_dim = {elem}")
            payload = dispatch_dtype
        cin = to_torch_dtype(combine_in_dtype) if combine_in_dtype is not None else torch.bfloat16
        cout = to_torch_dtype(combine_out_dtype) if combine_out_dtype is not None else torch.bfloat16
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise EpkitError("AllToAll cannot be created during CUDA graph capture (it allocates and "
                             "synchronises with peers); create it before capturing")
        self._impl: Optional[_NativeAllToAll] = _NativeAllToAll(AllToAllConfig(
            max_tokens_per_rank=max_num_tokens, num_experts=num_experts, topk=experts_per_token,
            rank=rank, world_size=world_size, dp_size=dp_size, hidden=hidden_dim, dispatch_dtype=payload,
            combine_in_dtype=cin, combine_out_dtype=cout, **extra))

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def internode(cls, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                  hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, **kwargs) -> "AllToAll":
        """Needs nvshmem_init first (as with pplx-kernels). Collective."""
        if not _C.initialized():
            raise EpkitError("AllToAll.internode needs NVSHMEM: call epkit.nvshmem_init(uid, rank, world_size) first")
        return cls(max_num_tokens=max_num_tokens, num_experts=num_experts, experts_per_token=experts_per_token,
                   rank=rank, world_size=world_size, dp_size=dp_size, hidden_dim=hidden_dim,
                   hidden_dim_bytes=hidden_dim_bytes, hidden_dim_scale_bytes=hidden_dim_scale_bytes, **kwargs)

    @classmethod
    def intranode(cls, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                  hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, group_name="default",
                  **kwargs) -> "AllToAll":
        """Same transport as internode; bootstraps NVSHMEM over torch.distributed if needed. Collective."""
        if not _C.initialized():
            _bootstrap_from_torch(group_name, rank, world_size)
        return cls(max_num_tokens=max_num_tokens, num_experts=num_experts, experts_per_token=experts_per_token,
                   rank=rank, world_size=world_size, dp_size=dp_size, hidden_dim=hidden_dim,
                   hidden_dim_bytes=hidden_dim_bytes, hidden_dim_scale_bytes=hidden_dim_scale_bytes, **kwargs)

    def _require(self) -> _NativeAllToAll:
        if self._impl is None:
            raise EpkitError("this AllToAll was destroyed")
        return self._impl

    # -- calls -----------------------------------------------------------------------------------
    def dispatch(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale, dp_x, dp_x_scale, indices,
                 bound_m, do_send=True, do_recv=True) -> None:
        """Shapes as in pplx-kernels: out_expert_x [E/W, max_num_tokens * (W / dp_size), H] in dp_x's
        dtype; indices [m, K] uint32; bound_m None (m = indices.shape[0]) or a one-element uint32
        device tensor. dp_x bf16 or fp16 (2-byte AllToAll) or fp8 e4m3 with dp_x_scale."""
        mode = _mode(do_send, do_recv)
        impl = self._require()
        try:
            out = DispatchOutput(as_tensor(out_expert_x, "out_expert_x"), out_expert_x_scale, out_expert_num_tokens)
            impl._dispatch(mode, as_tensor(dp_x, "dp_x"), indices, dp_x_scale, bound_m, out, None)
        except EpkitError as e:
            raise _pplx_names(e) from None

    def combine(self, out_tokens, indices, weights, expert_y, bound_m, do_send=True, do_recv=True) -> None:
        """out_tokens [>= m, H] bf16/fp16 receives sum_k weights[t, k] * expert_y(indices[t, k], t);
        expert_y bf16/fp16, independently of out_tokens. Pass out_tokens to both halves."""
        mode = _mode(do_send, do_recv)
        impl = self._require()
        try:
            impl._combine(mode, as_tensor(expert_y, "expert_y"), indices, weights, bound_m,
                          as_tensor(out_tokens, "out_tokens"))
        except EpkitError as e:
            raise _pplx_names(e) from None

    def destroy(self) -> None:
        """Frees the symmetric buffers. Collective; idempotent."""
        if self._impl is not None:
            self._impl.destroy()
            self._impl = None

    @property
    def impl(self) -> Optional[_NativeAllToAll]:
        """The idiomatic object underneath (None once destroyed)."""
        return self._impl


def _bootstrap_from_torch(group_name: str, rank: int, world_size: int) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise EpkitError("AllToAll.intranode needs NVSHMEM or torch.distributed to bootstrap it: call "
                         "epkit.nvshmem_init(uid, rank, world_size) or torch.distributed.init_process_group first")
    if group_name == "default":
        group = dist.group.WORLD
    else:
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group
            group = _resolve_process_group(group_name)
        except Exception as e:  # noqa: BLE001 - any lookup failure means the same thing to the caller
            raise EpkitError(f"no torch.distributed group named {group_name!r}: {e}") from e
    if dist.get_world_size(group) != world_size or dist.get_rank(group) != rank:
        raise EpkitError(f"group {group_name!r} has rank {dist.get_rank(group)} of {dist.get_world_size(group)}, "
                         f"but rank={rank}, world_size={world_size} were passed")
    uid = nvshmem_get_unique_id() if rank == 0 else nvshmem_alloc_empty_unique_id()
    box = [bytes(uid.tolist())]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    nvshmem_init(torch.frombuffer(bytearray(box[0]), dtype=torch.uint8), rank, world_size)
