"""AllToAll: the idiomatic epkit API (keyword names of the C++ AllToAllConfig and call args).

Every call launches on the caller's current CUDA stream of this PE's device, does not synchronise
the host and allocates only what it is asked to return, so dispatch/combine can be captured in a
torch.cuda.CUDAGraph when outputs are passed in (or allocated inside the capture).

dtypes come from each call's tensors, within the element sizes the config fixes (see
include/epkit/all_to_all.hpp): a bf16 or fp16 config takes bf16 or fp16 payloads, expert outputs
and outputs in any combination; the config's own dtypes only serve as defaults for returned outputs.

Under torch.compile the calls are torch custom ops (epkit._ops), so that Dynamo traces them without
a graph break; eager calls go to the extension directly.
"""

from typing import NamedTuple, Optional, Union

import torch

from . import _ops
from ._lib import EpkitError, _C
from ._tensors import arg, as_tensor
from .config import AllToAllConfig

NumTokens = Union[None, int, torch.Tensor]

_BOTH, _SEND, _RECV = 0, 1, 2


class DispatchOutput(NamedTuple):
    """Dispatch's outputs in the config's layout. masked: expert e's rows are expert_x[e, :n[e]];
    packed: expert_x[offsets[e]:offsets[e] + n[e]] (offsets aligned to packed_row_align)."""
    expert_x: torch.Tensor                   # masked [E/W, capacity, H]; packed [R, H]; dispatch dtype
    expert_x_scale: Optional[torch.Tensor]   # [..., ceil(H/128)] fp32 rows beside expert_x, fp8 only (expert_scale_shape)
    expert_num_tokens: torch.Tensor          # [E/W] int32: rows placed per local expert
    expert_offsets: Optional[torch.Tensor] = None  # packed only: [E/W + 1] int32, first row per expert, then rows in use


class _Pending(NamedTuple):
    """What a send half was given; the receive half takes the same arguments."""
    args: tuple
    result: object


def _stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _num_tokens(num_tokens: NumTokens, topk_idx):
    """(host m or -1, device count tensor or None). None means m = topk_idx.shape[0]."""
    if num_tokens is None:
        return int(topk_idx.shape[0]), None
    if isinstance(num_tokens, torch.Tensor):
        return -1, num_tokens
    return int(num_tokens), None


class AllToAll:
    """Expert-parallel dispatch and combine over NVSHMEM. Construction is collective.

    At world size 1 in a process that never called nvshmem_init, the object needs no NVSHMEM: it is a
    permutation on the current GPU and its inverse, with every call and semantic unchanged.

    ``AllToAll(AllToAllConfig(...))`` or ``AllToAll(num_experts=..., hidden=..., ...)``.
    Call destroy() (collective) when done, or use it as a context manager; an object dropped without
    it keeps its symmetric memory until nvshmem_finalize(), because freeing is collective.
    """

    def __init__(self, config: Optional[AllToAllConfig] = None, /, **fields):
        if config is None:
            config = AllToAllConfig(**fields)
        elif fields:
            raise TypeError("pass either an AllToAllConfig or its fields as keywords, not both")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise EpkitError("AllToAll cannot be created during CUDA graph capture (it allocates and "
                             "synchronises with peers); create it before capturing")
        self.config = config
        self._dtypes = config.torch_dtypes()
        self._impl = _C.AllToAll(config.to_cpp())
        cpp = self._impl.config
        self.num_local_experts = cpp.num_local_experts()
        self.capacity = cpp.effective_capacity()
        self.scales_per_token = cpp.scales_per_token()
        self.packed = cpp.layout == _C.ExpertLayout.packed
        self.packed_rows = cpp.effective_packed_rows() if self.packed else 0  # R
        self.device = torch.device("cuda", self._impl.device)
        self._op_id = _ops.register(self)

    # -- properties of the C++ object ------------------------------------------------------------
    @property
    def symmetric_bytes(self) -> int:
        return self._impl.symmetric_bytes

    @property
    def workspace_bytes(self) -> int:
        return self._impl.workspace_bytes

    @property
    def num_p2p_peers(self) -> int:
        return self._impl.num_p2p_peers

    @property
    def dispatch_dtype(self) -> torch.dtype:
        """The config's payload dtype: the default of returned outputs (a call may pass the other 16-bit one)."""
        return self._dtypes[0]

    @property
    def combine_in_dtype(self) -> torch.dtype:
        return self._dtypes[1]

    @property
    def combine_out_dtype(self) -> torch.dtype:
        """The default dtype of returned combine outputs."""
        return self._dtypes[2]

    # -- outputs ---------------------------------------------------------------------------------
    def expert_shape(self, inner: Optional[int] = None):
        """Shape of the expert-major tensors (expert_x, expert_y) in this layout, trailing dim `inner` (H)."""
        inner = self.config.hidden if inner is None else inner
        if self.packed:
            return (self.packed_rows, inner)
        return (self.num_local_experts, self.capacity, inner)

    def expert_scale_shape(self):
        """Shape of expert_x_scale: expert_shape(ceil(H/128)), or [E/W, ceil(H/128), capacity] with
        expert_scales_mn_major (each expert's scales token-minor, as DeepGEMM's masked GEMM reads them)."""
        if self.config.expert_scales_mn_major:
            return (self.num_local_experts, self.scales_per_token, self.capacity)
        return self.expert_shape(self.scales_per_token)

    def empty_dispatch_output(self, dtype: Optional[torch.dtype] = None) -> DispatchOutput:
        """Uninitialized dispatch outputs of this layout on this PE's device; expert_x in `dtype` (the
        payload's, default the config's)."""
        L = self.num_local_experts
        scale = None
        if self.scales_per_token:
            scale = torch.empty(self.expert_scale_shape(), dtype=torch.float32, device=self.device)
        offsets = torch.empty((L + 1,), dtype=torch.int32, device=self.device) if self.packed else None
        return DispatchOutput(
            torch.empty(self.expert_shape(), dtype=dtype or self.dispatch_dtype, device=self.device),
            scale,
            torch.empty((L,), dtype=torch.int32, device=self.device),
            offsets,
        )

    def empty_combine_output(self, num_rows: Optional[int] = None, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Uninitialized combine output [num_rows or max_tokens_per_rank, H] in `dtype` (default combine_out)."""
        rows = self.config.max_tokens_per_rank if num_rows is None else num_rows
        return torch.empty((rows, self.config.hidden), dtype=dtype or self.combine_out_dtype, device=self.device)

    # -- dispatch --------------------------------------------------------------------------------
    def _dispatch(self, mode, x, topk_idx, x_scale, num_tokens, out: DispatchOutput, topk_weights):
        m, m_dev = _num_tokens(num_tokens, topk_idx)
        args = (mode, x, x_scale, topk_idx, m, m_dev, out.expert_x, out.expert_x_scale, out.expert_num_tokens,
                out.expert_offsets, topk_weights)
        if _ops.compiling():
            _ops.dispatch(self._op_id, *args)
        elif _ops.tracing():
            self._dispatch_untraced(*args)  # a graph break: Dynamo runs it eagerly
        else:
            self._dispatch_now(*args)

    def _dispatch_now(self, mode, x, x_scale, topk_idx, m, m_dev, expert_x, expert_x_scale, expert_num_tokens,
                      expert_offsets, topk_weights):
        self._impl.dispatch(mode, arg(x, "x"), arg(x_scale, "x_scale"), arg(topk_idx, "topk_idx"), m,
                            arg(m_dev, "num_tokens"), arg(expert_x, "expert_x"),
                            arg(expert_x_scale, "expert_x_scale"), arg(expert_num_tokens, "expert_num_tokens"),
                            arg(expert_offsets, "expert_offsets"), arg(topk_weights, "topk_weights"), _stream(self.device.index))

    _dispatch_untraced = _ops.not_traced(_dispatch_now)

    def dispatch(self, x, topk_idx, x_scale=None, *, num_tokens: NumTokens = None,
                 out: Optional[DispatchOutput] = None, topk_weights=None) -> DispatchOutput:
        """Sends each token [m, H] to the ranks of its experts and returns the expert-major outputs.

        topk_idx [m, K] int32/int64/uint32 (negative = no expert); x_scale [m, ceil(H/128)] fp32 for
        fp8; num_tokens: None (m = topk_idx.shape[0]), an int, or a one-element int32/uint32 device
        tensor (one CUDA graph serves any m). topk_weights [m, K] fp32: required with
        weights_at_dispatch (combine then takes none), refused without it.
        """
        out = out if out is not None else self.empty_dispatch_output(as_tensor(x, "x").dtype)
        self._dispatch(_BOTH, x, topk_idx, x_scale, num_tokens, out, topk_weights)
        return out

    def dispatch_send(self, x, topk_idx, x_scale=None, *, num_tokens: NumTokens = None,
                      out: Optional[DispatchOutput] = None, topk_weights=None) -> _Pending:
        """The send half; pass what it returns to dispatch_recv. Other work may run in between."""
        out = out if out is not None else self.empty_dispatch_output(as_tensor(x, "x").dtype)
        self._dispatch(_SEND, x, topk_idx, x_scale, num_tokens, out, topk_weights)
        return _Pending((x, topk_idx, x_scale, num_tokens, out, topk_weights), out)

    def dispatch_recv(self, pending: _Pending) -> DispatchOutput:
        self._dispatch(_RECV, *pending.args)
        return pending.result

    # -- combine ---------------------------------------------------------------------------------
    def _combine(self, mode, expert_y, topk_idx, topk_weights, num_tokens, out):
        m, m_dev = _num_tokens(num_tokens, topk_idx)
        args = (mode, expert_y, topk_idx, topk_weights, m, m_dev, out)
        if _ops.compiling():
            _ops.combine(self._op_id, *args)
        elif _ops.tracing():
            self._combine_untraced(*args)
        else:
            self._combine_now(*args)

    def _combine_now(self, mode, expert_y, topk_idx, topk_weights, m, m_dev, out):
        self._impl.combine(mode, arg(expert_y, "expert_y"), arg(topk_idx, "topk_idx"),
                           arg(topk_weights, "topk_weights"), m, arg(m_dev, "num_tokens"), arg(out, "out"),
                           _stream(self.device.index))

    _combine_untraced = _ops.not_traced(_combine_now)

    def combine(self, expert_y, topk_idx, topk_weights=None, *, num_tokens: NumTokens = None,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Returns out[t] = sum_k topk_weights[t, k] * expert_y(topk_idx[t, k], t) for t < m.

        expert_y (expert_shape(): [E/W, capacity, H] or packed [R, H]) holds the expert outputs row for
        row as dispatched; topk_idx and
        num_tokens as given to the matching dispatch; out defaults to [topk_idx.shape[0], H].
        topk_weights [m, K] fp32, or None with weights_at_dispatch (the dispatch carried them).
        expert_y bf16/fp16 (fp32 if the config's combine_in_dtype is); pass out= for an output dtype
        other than combine_out_dtype.
        """
        out = out if out is not None else self.empty_combine_output(topk_idx.shape[0])
        self._combine(_BOTH, expert_y, topk_idx, topk_weights, num_tokens, out)
        return out

    def combine_send(self, expert_y, topk_idx, topk_weights=None, *, num_tokens: NumTokens = None,
                     out: Optional[torch.Tensor] = None) -> _Pending:
        out = out if out is not None else self.empty_combine_output(topk_idx.shape[0])
        self._combine(_SEND, expert_y, topk_idx, topk_weights, num_tokens, out)
        return _Pending((expert_y, topk_idx, topk_weights, num_tokens, out), out)

    def combine_recv(self, pending: _Pending) -> torch.Tensor:
        self._combine(_RECV, *pending.args)
        return pending.result

    # -- lifetime --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raises EpkitError if a finished kernel recorded an error (synchronise the stream first)."""
        self._impl.check()

    def destroy(self) -> None:
        """Frees the symmetric buffers. Collective; idempotent."""
        self._impl.destroy()

    @property
    def alive(self) -> bool:
        return self._impl.alive

    @property
    def failed(self) -> bool:
        """True once a device-side timeout was recorded (read without synchronising): a peer is dead or
        stuck, and every call (and check()) raises that timeout."""
        return self._impl.failed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False
