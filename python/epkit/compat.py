"""AllToAll with the API of pplx-kernels' Python package, so engines switch by changing the import.

pplx learns the payload and output dtypes from the tensors at each call; epkit's C++ object fixes
them at creation (they size the symmetric buffers). The mapping:

* hidden_dim_bytes // hidden_dim == 1: the payload is fp8 e4m3 with one fp32 scale per 128 elements
  (hidden_dim_scale_bytes >= ceil(hidden_dim / 128) * 4). The C++ object is created in the
  constructor.
* == 2: the payload is bf16 or fp16, whichever dp_x is at the first dispatch; the C++ object is
  created there (still collective: every rank makes that call). Pass dispatch_dtype= to create it
  up front instead, which is required if the first dispatch is inside CUDA graph capture.
* combine dtypes: expert_y and out_tokens must be the payload dtype for 16-bit payloads and bf16
  for fp8, unless combine_in_dtype= / combine_out_dtype= say otherwise. A combine with other dtypes
  raises EpkitError naming the keyword to pass; nothing is converted behind the caller's back.

intranode() takes the same path as internode() (NVSHMEM, with direct loads/stores to peers on the
same node). If NVSHMEM is not yet initialized it bootstraps it over the torch.distributed group
(group_name "default" is the world group), as pplx's intranode needs no NVSHMEM setup.
"""

from typing import Optional

import torch

from ._lib import EpkitError, _C
from ._tensors import as_tensor, to_torch_dtype
from .all_to_all import DispatchOutput, ExpertAllToAll, _BOTH, _RECV, _SEND
from .config import AllToAllConfig
from .nvshmem import nvshmem_alloc_empty_unique_id, nvshmem_get_unique_id, nvshmem_init

_SCALE_BLOCK = 128


def _mode(do_send: bool, do_recv: bool) -> int:
    if do_send and do_recv:
        return _BOTH
    if do_send:
        return _SEND
    if do_recv:
        return _RECV
    raise EpkitError("do_send and do_recv are both False: nothing to do")


class AllToAll:
    """pplx-kernels compatible dispatch/combine. Create with internode() or intranode()."""

    def __init__(self, *, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                 hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, dispatch_dtype=None,
                 combine_in_dtype=None, combine_out_dtype=None, **extra):
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
            payload = None
        else:
            raise EpkitError(f"hidden_dim_bytes / hidden_dim = {hidden_dim_bytes / hidden_dim:g}: the payload "
                             "must be 1 byte (fp8 e4m3) or 2 bytes (bf16, fp16) per element")
        if dispatch_dtype is not None:
            dispatch_dtype = to_torch_dtype(dispatch_dtype)
            size = torch.empty((), dtype=dispatch_dtype).element_size()
            if size != elem:
                raise EpkitError(f"dispatch_dtype {dispatch_dtype} has {size}-byte elements but "
                                 f"hidden_dim_bytes / hidden_dim = {elem}")
            payload = dispatch_dtype
        self._fields = dict(max_tokens_per_rank=max_num_tokens, num_experts=num_experts,
                            experts_per_token=experts_per_token, rank=rank, world_size=world_size,
                            dp_size=dp_size, hidden=hidden_dim, **extra)
        self._combine_in = to_torch_dtype(combine_in_dtype) if combine_in_dtype is not None else None
        self._combine_out = to_torch_dtype(combine_out_dtype) if combine_out_dtype is not None else None
        self._impl: Optional[ExpertAllToAll] = None
        self._destroyed = False
        if payload is not None:
            self._create(payload)

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

    def _create(self, payload: torch.dtype) -> None:
        if self._destroyed:
            raise EpkitError("this AllToAll was destroyed")
        default_out = torch.bfloat16 if payload == torch.float8_e4m3fn else payload
        cin = self._combine_in or default_out
        cout = self._combine_out or default_out
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise EpkitError(f"creating the {payload} AllToAll (at construction, or at the first dispatch for "
                             "16-bit payloads) cannot happen during CUDA graph capture: run one dispatch before "
                             "capturing, or pass dispatch_dtype= to AllToAll.internode/intranode")
        self._impl = ExpertAllToAll(AllToAllConfig(dispatch_dtype=payload, combine_in_dtype=cin,
                                                   combine_out_dtype=cout, **self._fields))

    def _require(self, what: str) -> ExpertAllToAll:
        if self._destroyed:
            raise EpkitError("this AllToAll was destroyed")
        if self._impl is None:
            raise EpkitError(f"{what} before the first dispatch: the payload dtype is not known yet")
        return self._impl

    # -- calls -----------------------------------------------------------------------------------
    def dispatch(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale, dp_x, dp_x_scale, indices,
                 bound_m, do_send=True, do_recv=True) -> None:
        """Shapes as in pplx-kernels: out_expert_x [E/W, max_num_tokens * (W / dp_size), H];
        indices [m, K] uint32; bound_m None (m = indices.shape[0]) or a one-element uint32 device tensor."""
        mode = _mode(do_send, do_recv)
        dp_x, out_expert_x = as_tensor(dp_x, "dp_x"), as_tensor(out_expert_x, "out_expert_x")
        if self._impl is None and not self._destroyed:
            if dp_x.dtype not in (torch.bfloat16, torch.float16):
                raise EpkitError(f"dp_x is {dp_x.dtype} but hidden_dim_bytes / hidden_dim = 2 needs bf16 or fp16")
            self._create(dp_x.dtype)
        impl = self._require("dispatch")
        for name, t in (("dp_x", dp_x), ("out_expert_x", out_expert_x)):
            if t.dtype != impl.dispatch_dtype:
                raise EpkitError(f"{name} is {t.dtype} but this AllToAll's payload is {impl.dispatch_dtype}")
        out = DispatchOutput(out_expert_x, out_expert_x_scale, out_expert_num_tokens)
        impl._dispatch(mode, dp_x, indices, dp_x_scale, bound_m, out, None)

    def combine(self, out_tokens, indices, weights, expert_y, bound_m, do_send=True, do_recv=True) -> None:
        """out_tokens [>= m, H] bf16/fp16 receives sum_k weights[t, k] * expert_y(indices[t, k], t)."""
        mode = _mode(do_send, do_recv)
        impl = self._require("combine")
        expert_y, out_tokens = as_tensor(expert_y, "expert_y"), as_tensor(out_tokens, "out_tokens")
        for name, t, want, kw in (("expert_y", expert_y, impl.combine_in_dtype, "combine_in_dtype"),
                                  ("out_tokens", out_tokens, impl.combine_out_dtype, "combine_out_dtype")):
            if t.dtype != want:
                raise EpkitError(f"{name} is {t.dtype} but this AllToAll was created for {want}; pass "
                                 f"{kw}={t.dtype} to AllToAll.internode/intranode")
        impl._combine(mode, expert_y, indices, weights, bound_m, out_tokens)

    def destroy(self) -> None:
        """Frees the symmetric buffers. Collective; idempotent."""
        if self._impl is not None:
            self._impl.destroy()
            self._impl = None
        self._destroyed = True

    @property
    def impl(self) -> Optional[ExpertAllToAll]:
        """The idiomatic object underneath (None until the payload dtype is known)."""
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
