"""The MoE kernels and MoELayer.forward as torch custom ops, for torch.compile.

As with dispatch/combine (epkit/_ops.py): every op writes into outputs the caller allocated, which
are declared in mutates_args, and returns nothing. The public functions of epkit.moe allocate the
outputs (torch.empty, which Dynamo traces) and call these ops only while Dynamo traces; eager calls
go straight to epkit._moe_impl. Objects (an ErrorRecord, a MoELayer) travel as integer ids.

Argument names avoid `mode` (auto_functionalized takes a keyword of that name, and fullgraph
compilation failed on it with torch 2.11), and, to be safe, `out`, `input` and names starting with
an underscore.

Where this torch cannot register them, UNAVAILABLE says why and compiled code breaks its graph at
each call instead (as with EPKIT_TORCH_OPS=0).
"""

from typing import Optional

import torch

from . import _moe_impl as impl
from . import _ops


def _layer(handle: int):
    obj = _ops._objects.get(handle)
    if obj is None:
        from ._lib import EpkitError
        raise EpkitError(f"epkit op called for MoELayer #{handle}, which no longer exists")
    return obj


def _define():
    op = torch.library.custom_op

    @op("epkit::moe_route", mutates_args=("topk_idx", "topk_weights", "num_tokens_out"))
    def moe_route(logits: torch.Tensor, bias: Optional[torch.Tensor], topk_idx: torch.Tensor,
                  topk_weights: torch.Tensor, num_tokens_out: Optional[torch.Tensor], num_tokens: int,
                  num_tokens_device: Optional[torch.Tensor], router_mode: int, num_experts: int, topk: int,
                  num_groups: int, topk_groups: int, renormalize: bool, routed_scaling: float, error: int) -> None:
        impl.route_now(logits, bias, topk_idx, topk_weights, num_tokens_out, num_tokens, num_tokens_device,
                       router_mode, num_experts, topk, num_groups, topk_groups, renormalize, routed_scaling, error)

    @moe_route.register_fake
    def _(logits, bias, topk_idx, topk_weights, num_tokens_out, num_tokens, num_tokens_device, router_mode,
          num_experts, topk, num_groups, topk_groups, renormalize, routed_scaling, error):
        return None

    @op("epkit::moe_quantize", mutates_args=("q", "scale"))
    def moe_quantize(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, ue8m0: bool, num_tokens: int,
                     num_tokens_device: Optional[torch.Tensor], error: int) -> None:
        impl.quantize_now(x, q, scale, ue8m0, num_tokens, num_tokens_device, error)

    @moe_quantize.register_fake
    def _(x, q, scale, ue8m0, num_tokens, num_tokens_device, error):
        return None

    @op("epkit::moe_quantize_weights", mutates_args=("q", "scale_inv"))
    def moe_quantize_weights(w: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, ue8m0: bool) -> None:
        impl.quantize_weights_now(w, q, scale_inv, ue8m0)

    @moe_quantize_weights.register_fake
    def _(w, q, scale_inv, ue8m0):
        return None

    @op("epkit::moe_grouped_gemm", mutates_args=("d",))
    def moe_grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                         d: torch.Tensor, expert_num_tokens: torch.Tensor, expert_offsets: Optional[torch.Tensor],
                         expected_m: int, config: str, error: int) -> None:
        impl.grouped_gemm_now(a, a_scale, b, b_scale, d, expert_num_tokens, expert_offsets, expected_m, config, error)

    @moe_grouped_gemm.register_fake
    def _(a, a_scale, b, b_scale, d, expert_num_tokens, expert_offsets, expected_m, config, error):
        return None

    @op("epkit::moe_silu_mul_quantize", mutates_args=("q", "scale"))
    def moe_silu_mul_quantize(h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, expert_num_tokens: torch.Tensor,
                              expert_offsets: Optional[torch.Tensor], ue8m0: bool, error: int) -> None:
        impl.silu_mul_quantize_now(h, q, scale, expert_num_tokens, expert_offsets, ue8m0, error)

    @moe_silu_mul_quantize.register_fake
    def _(h, q, scale, expert_num_tokens, expert_offsets, ue8m0, error):
        return None

    @op("epkit::moe_layer_forward", mutates_args=("y",))
    def moe_layer_forward(handle: int, x: torch.Tensor, y: torch.Tensor, num_tokens: int,
                          num_tokens_device: Optional[torch.Tensor]) -> None:
        _layer(handle)._forward_now(x, y, num_tokens, num_tokens_device)

    @moe_layer_forward.register_fake
    def _(handle, x, y, num_tokens, num_tokens_device):
        return None

    o = torch.ops.epkit
    return (o.moe_route.default, o.moe_quantize.default, o.moe_quantize_weights.default, o.moe_grouped_gemm.default,
            o.moe_silu_mul_quantize.default, o.moe_layer_forward.default)


try:
    route, quantize, quantize_weights, grouped_gemm, silu_mul_quantize, layer_forward = _define()
    UNAVAILABLE = ""
except Exception as e:  # noqa: BLE001 - any failure means: fall back to graph breaks
    route = quantize = quantize_weights = grouped_gemm = silu_mul_quantize = layer_forward = None
    UNAVAILABLE = f"{type(e).__name__}: {e}"


def compiling() -> bool:
    """True while Dynamo traces and these ops are in use (see epkit._ops.use_ops)."""
    return _ops.use_ops and route is not None and _ops.tracing()
