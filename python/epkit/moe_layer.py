"""epkit.MoELayer: one DeepSeek-V3-class MoE layer, gate GEMM to combine, over torch tensors.

    out = sum_k w_k * expert_k(x) + shared(x),  expert(x) = W2 . (silu(W1 x) * (W3 x)) in FP8

The C++ epkit::MoELayer (include/epkit/moe_layer.hpp) owns its AllToAll objects (two under the
microbatch schedule). At world size 1 (one GPU serving the whole model) it needs nothing else:
without nvshmem_init it is a single-process layer on the current GPU. With several ranks it lives
on this process's NVSHMEM PE like epkit.AllToAll: call epkit.nvshmem_init first, and create and
destroy() layers in the same order on every rank (both are collective).

The weights are the caller's tensors, in the DeepSeek-V3 checkpoint layout; the layer keeps views
of them, and this object keeps the tensors alive.
"""

from dataclasses import dataclass, fields
from typing import Dict, List, NamedTuple, Optional, Union

import torch

from . import _moe_impl as impl
from . import _moe_ops, _ops
from ._lib import EpkitError, _C
from ._tensors import arg
from .config import _LAYOUTS, parse_enum

NumTokens = Union[None, int, torch.Tensor]

_SCHEDULES = {"none": _C.MoESchedule.none, "dispatch_overlap": _C.MoESchedule.dispatch_overlap,
              "microbatch": _C.MoESchedule.microbatch}
_STAGE_ROUTE, _STAGE_DISPATCH_SEND, _STAGE_EXPERTS, _STAGE_COMBINE_RECV = 0, 1, 2, 3

# The MoELayerWeights fields, in the C++ constructor's order.
WEIGHT_NAMES = ("w13", "w13_scale", "w2", "w2_scale", "shared_w13", "shared_w13_scale", "shared_w2",
                "shared_w2_scale", "gate", "gate_bias")


@dataclass
class MoELayerConfig:
    """epkit::MoELayerConfig, same field names (include/epkit/moe_layer.hpp).

    world_size and rank default to the NVSHMEM PE count and index, or to 1 and 0 where NVSHMEM is
    not initialized. router_mode "grouped_topk" or
    "softmax_topk"; schedule "none", "dispatch_overlap" or "microbatch"; layout "masked" or "packed".
    """

    hidden: int                        # H: multiple of 128 (DeepSeek-V3: 7168)
    intermediate: int                  # I of one routed expert: multiple of 128 (2048)
    num_experts: int                   # E routed experts; E % world_size == 0
    topk: int                          # K
    max_tokens_per_rank: int           # M: most tokens one forward() takes (per DP group)
    router_mode: str = "grouped_topk"
    num_groups: int = 1                # grouped top-k: n_group
    topk_groups: int = 1               # grouped top-k: groups kept
    renormalize: bool = True           # softmax top-k: renormalise the K weights
    routed_scaling: float = 1.0        # weight scale (DeepSeek-V3: 2.5)
    num_shared_experts: int = 0        # 0 or 1
    shared_intermediate: int = 0       # I of the shared expert; 0 means intermediate
    world_size: Optional[int] = None   # W
    rank: Optional[int] = None
    dp_size: int = 1                   # D: ranks per DP group (identical tokens)
    schedule: str = "none"
    layout: str = "packed"             # dispatch's expert-major layout (packed: no capacity padding)
    expected_tokens: int = 0           # device m only: tokens the GEMM configs are chosen for; 0 means the rows of x
    shared_concurrent: bool = True     # schedule none: the shared expert on its own stream (graph branch)
    ue8m0_scales: bool = False         # power-of-two activation scales
    fused_gate_router: bool = True     # decode batches (<= 32 tokens): gate GEMM + router in one kernel (moe::GateRouter)
    timeout_ms: int = -1               # bound on device waits (-1: EPKIT_TIMEOUT_MS, else 10 s)

    def to_cpp(self) -> "_C.MoELayerConfig":
        c = _C.MoELayerConfig()
        for name in ("hidden", "intermediate", "num_experts", "topk", "max_tokens_per_rank", "num_groups",
                     "topk_groups", "num_shared_experts", "shared_intermediate", "dp_size", "expected_tokens",
                     "timeout_ms"):
            setattr(c, name, int(getattr(self, name)))
        c.renormalize = bool(self.renormalize)
        c.ue8m0_scales = bool(self.ue8m0_scales)
        c.shared_concurrent = bool(self.shared_concurrent)
        c.fused_gate_router = bool(self.fused_gate_router)
        c.routed_scaling = float(self.routed_scaling)
        # Defaults: this NVSHMEM PE, or world size 1 (no NVSHMEM needed) where NVSHMEM is not initialized.
        on_pe = _C.initialized()
        c.world_size = int(self.world_size if self.world_size is not None else (_C.n_pes() if on_pe else 1))
        c.rank = int(self.rank if self.rank is not None else (_C.my_pe() if on_pe else 0))
        c.router_mode = parse_enum("MoELayerConfig", "router_mode", self.router_mode,
                                   {k: _C.RouterMode(v) for k, v in impl.ROUTER_MODES.items()}, _C.RouterMode)
        c.schedule = parse_enum("MoELayerConfig", "schedule", self.schedule, _SCHEDULES, _C.MoESchedule)
        c.layout = parse_enum("MoELayerConfig", "layout", self.layout, _LAYOUTS, _C.ExpertLayout)
        return c

    def validate(self) -> None:
        """Raises EpkitError naming the first field out of range (the C++ validate)."""
        self.to_cpp().validate()

    @property
    def num_local_experts(self) -> int:
        return self.to_cpp().num_local_experts()

    @property
    def workspace_bytes(self) -> int:
        """Device bytes a layer of this config allocates for its activations (the C++ formula)."""
        return self.to_cpp().workspace_bytes()

    @classmethod
    def field_names(cls) -> List[str]:
        return [f.name for f in fields(cls)]


class LayerRouting(NamedTuple):
    logits: torch.Tensor        # [rows, E] fp32 gate logits
    topk_idx: torch.Tensor      # [rows, K] int32 (global expert ids, best first)
    topk_weights: torch.Tensor  # [rows, K] fp32


class MoELayer:
    """One MoE layer: ``MoELayer(hidden=..., intermediate=..., ..., w13=..., w2=..., gate=..., ...)``
    or ``MoELayer(MoELayerConfig(...), w13=..., ...)``. Construction is collective.

    Weights (device tensors of this PE's GPU, checkpoint layout; L = E / world_size local experts):
      w13 [L, 2I, H] e4m3fn (rows [0, I) gate, [I, 2I) up) + w13_scale [L, 2I/128, H/128] fp32,
      w2 [L, H, I] e4m3fn + w2_scale [L, H/128, I/128] fp32,
      shared_w13 [2Is, H] / shared_w2 [H, Is] (+ scales) when num_shared_experts == 1,
      gate [E, H] bf16, gate_bias [E] fp32 (grouped top-k; optional).

    Call destroy() (collective) when done, or use it as a context manager; a layer dropped without
    it keeps its buffers until nvshmem_finalize().
    """

    def __init__(self, config: Optional[MoELayerConfig] = None, /, **kwargs):
        weights: Dict[str, Optional[torch.Tensor]] = {n: kwargs.pop(n, None) for n in WEIGHT_NAMES}
        if config is None:
            config = MoELayerConfig(**kwargs)
        elif kwargs:
            raise TypeError(f"pass either a MoELayerConfig or its fields as keywords, not both (got {sorted(kwargs)})")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise EpkitError("MoELayer cannot be created during CUDA graph capture (it allocates and agrees with "
                             "peers); create it before capturing")
        self.config = config
        self._weights = weights  # the C++ layer holds views of these: they must live as long as it
        self._impl = _C.MoELayer(config.to_cpp(), *(arg(weights[n], n) for n in WEIGHT_NAMES))
        cpp = self._impl.config
        self.hidden = cpp.hidden
        self.num_local_experts = cpp.num_local_experts()
        self.halves = 2 if cpp.schedule == _C.MoESchedule.microbatch else 1
        self.device = torch.device("cuda", self._impl.device)
        self._batch = None  # (x, out, num_tokens) between begin() and the last stage: the layer holds their pointers
        self._op_id = _ops.register(self)

    # -- properties ------------------------------------------------------------------------------
    @property
    def weights(self) -> Dict[str, Optional[torch.Tensor]]:
        return dict(self._weights)

    @property
    def workspace_bytes(self) -> int:
        return self._impl.workspace_bytes

    @property
    def symmetric_bytes(self) -> int:
        return self._impl.symmetric_bytes

    @property
    def alive(self) -> bool:
        return self._impl.alive

    # -- forward ---------------------------------------------------------------------------------
    def empty_output(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, self.hidden), dtype=torch.bfloat16, device=self.device)

    def forward(self, x: torch.Tensor, out: Optional[torch.Tensor] = None, num_tokens: NumTokens = None) -> torch.Tensor:
        """out[t] = sum_k w[t,k] * expert_{idx[t,k]}(x[t]) + shared(x[t]) for t < m; x [rows, H] bf16
        with rows <= max_tokens_per_rank, out [rows, H] bf16 (allocated when not given); rows t >= m
        of out are left untouched.

        num_tokens: None (m = rows), an int, or a one-element int32 device tensor holding m: one
        CUDA graph captured with it serves every m <= rows (the rows of x are the graph's bucket).
        No host synchronisation or allocation beyond `out`: capturable, and traced by torch.compile
        as the custom op epkit::moe_layer_forward.
        """
        if out is None:
            out = torch.empty((x.shape[0], self.hidden), dtype=torch.bfloat16, device=x.device)
        m, m_dev = impl.num_tokens_arg(num_tokens, x.shape[0])
        if _moe_ops.compiling():
            _moe_ops.layer_forward(self._op_id, x, out, m, m_dev)
        elif _ops.tracing():
            self._forward_untraced(x, out, m, m_dev)
        else:
            self._forward_now(x, out, m, m_dev)
        return out

    __call__ = forward

    def _forward_now(self, x, out, m, m_dev):
        self._impl.forward(arg(x, "x"), arg(out, "out"), m, arg(m_dev, "num_tokens"), _stream(self.device.index))

    _forward_untraced = _ops.not_traced(_forward_now)

    # -- stages ----------------------------------------------------------------------------------
    # The seed's 5-stage schedule as calls, for engines that put attention between them: per layer
    # call, begin(), then for each half (0, and 1 under microbatch) stage_route, stage_dispatch_send,
    # stage_experts, stage_combine_recv, in that order. They hold pointers from begin(), so under
    # torch.compile each is a graph break (run eagerly); use forward() in compiled code.
    def begin(self, x: torch.Tensor, out: Optional[torch.Tensor] = None, num_tokens: NumTokens = None) -> torch.Tensor:
        """Binds one batch (as forward) for the stage calls; returns out, complete after the last
        stage_combine_recv. x, out and a device num_tokens are kept alive until then."""
        if out is None:
            out = torch.empty((x.shape[0], self.hidden), dtype=torch.bfloat16, device=x.device)
        m, m_dev = impl.num_tokens_arg(num_tokens, x.shape[0])
        self._begin_untraced(x, out, m, m_dev)
        return out

    def _begin_now(self, x, out, m, m_dev):
        self._impl.begin(arg(x, "x"), arg(out, "out"), m, arg(m_dev, "num_tokens"), _stream(self.device.index))
        self._batch = (x, out, m_dev)

    _begin_untraced = _ops.not_traced(_begin_now)

    def _stage_now(self, which: int, half: int):
        self._impl.stage(which, int(half), _stream(self.device.index))

    _stage_untraced = _ops.not_traced(_stage_now)

    def stage_route(self, half: int = 0) -> None:
        """Gate GEMM, router, activation quantization (the seed's stage 2 gate)."""
        self._stage_untraced(_STAGE_ROUTE, half)

    def stage_dispatch_send(self, half: int = 0) -> None:
        """dispatch_send, then the shared expert (stage 3)."""
        self._stage_untraced(_STAGE_DISPATCH_SEND, half)

    def stage_experts(self, half: int = 0) -> None:
        """dispatch_recv, both grouped GEMMs + SiLU-mul, combine_send (stage 4)."""
        self._stage_untraced(_STAGE_EXPERTS, half)

    def stage_combine_recv(self, half: int = 0) -> None:
        """combine_recv, then out += the shared expert (stage 5)."""
        self._stage_untraced(_STAGE_COMBINE_RECV, half)

    # -- diagnostics and lifetime ----------------------------------------------------------------
    def routing(self, half: int = 0) -> LayerRouting:
        """Views of half `half`'s gate logits, topk_idx and topk_weights of the last forward (rows of
        that half; the first m are valid). Valid until destroy(); read after the stream finished."""
        lg, idx, w = self._impl.routing(int(half))
        return LayerRouting(torch.from_dlpack(lg), torch.from_dlpack(idx), torch.from_dlpack(w))

    def expert_counts(self, half: int = 0) -> List[int]:
        """Tokens each local expert received in half `half`'s last dispatch (synchronises the device)."""
        return list(self._impl.expert_counts(int(half)))

    def check(self) -> None:
        """Raises EpkitError for device-side violations recorded by earlier calls (expert compute and
        dispatch/combine). Does not synchronise: call after the stream finished the work."""
        self._impl.check()

    def destroy(self) -> None:
        """Frees the layer and its AllToAll buffers. Collective; idempotent."""
        self._batch = None
        self._impl.destroy()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False


def _stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream
