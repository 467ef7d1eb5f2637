"""The MoE expert compute as functional ops over torch tensors: router, FP8 block quantization of
activations and weights, the grouped FP8 GEMM, and SiLU-mul fused with quantization. The
semantics (shapes, roundings, tie rules) are those of include/epkit/moe/*.hpp.

Every function launches on the current CUDA stream of its tensors' device, never synchronises the
host, and allocates only the outputs it is not given, so all of them can be captured in a CUDA
graph (pass the outputs, or let them be allocated inside the capture). Counts may live on the
device (`num_tokens` as a one-element int32 tensor, `expert_num_tokens`): one captured graph then
serves every m. The one exception is the first grouped_gemm call of a shape, which builds its
GroupedGemm object (device memory) and must happen before capturing.

Device-side violations (a device m above the rows, an expert count above the capacity, packed
offsets out of range) are clamped, never written out of bounds, and recorded: in `error` (an
epkit.ErrorRecord) when given, else in the device's default record, which check() reads.

Under torch.compile the calls are torch custom ops (epkit::moe_*, epkit/_moe_ops.py) that Dynamo
traces without graph breaks; eager calls go to the extension directly.
"""

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Union

import torch

from . import _moe_impl as impl
from . import _moe_ops, _ops
from ._lib import EpkitError, _C
from ._tensors import arg
from .config import _LAYOUTS, parse_enum

NumTokens = Union[None, int, torch.Tensor]

FP8 = torch.float8_e4m3fn
SCALE_BLOCK = 128


def _blocks(n: int) -> int:
    return (n + SCALE_BLOCK - 1) // SCALE_BLOCK


class ErrorRecord:
    """Host-mapped record of the first device-side violation of the kernels given it (`error=`).

    check() raises EpkitError with the violation and re-arms; call it after the work finished
    (e.g. after torch.cuda.synchronize()). Keep the object alive while graphs that use it exist."""

    def __init__(self, device=None):
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise EpkitError(f"ErrorRecord: device must be a CUDA device, got {dev}")
        self.device = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        self._impl = _C.ErrorRecord(self.device.index)
        self._op_id = _ops.register(self)

    @property
    def pending(self) -> bool:
        return self._impl.pending

    def message(self) -> str:
        return self._impl.message()

    def check(self) -> None:
        self._impl.check()

    def reset(self) -> None:
        self._impl.reset()


def _error_id(error: Optional[ErrorRecord]) -> int:
    return 0 if error is None else error._op_id


def check(device=None) -> None:
    """Raises EpkitError if a kernel called without `error=` on `device` (default: the current one)
    recorded a violation. Does not synchronise: call after the work has finished."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    rec = impl._default_records.get(index)
    if rec is not None:
        rec.check()


# -- router ------------------------------------------------------------------------------------

@dataclass
class RouterConfig:
    """epkit::moe::RouterConfig, same field names (include/epkit/moe/router.hpp).

    mode "grouped_topk" (DeepSeek-V3 noaux_tc: sigmoid scores + bias, best groups, then top-k) or
    "softmax_topk" (Mixtral / Qwen-MoE). Ties: among equal scores the lower expert index wins
    (among equal group scores, the lower group index); -0 ranks as +0, NaN below every number.
    """

    num_experts: int                 # E: 1..512
    topk: int                        # K: 1..16
    mode: str = "grouped_topk"
    num_groups: int = 1              # n_group (grouped mode): divides E
    topk_groups: int = 1             # groups kept (grouped mode)
    renormalize: bool = True         # softmax mode: divide by the sum of the K weights (grouped: must be True)
    routed_scaling: float = 1.0      # every weight times this (DeepSeek-V3: 2.5)

    def mode_code(self) -> int:
        if self.mode not in impl.ROUTER_MODES:
            raise EpkitError(f"RouterConfig.mode = {self.mode!r} is not one of {sorted(impl.ROUTER_MODES)}")
        return impl.ROUTER_MODES[self.mode]

    def to_cpp(self) -> "_C.RouterConfig":
        return impl._router_config(self.mode_code(), int(self.num_experts), int(self.topk), int(self.num_groups),
                                   int(self.topk_groups), bool(self.renormalize), float(self.routed_scaling))

    def validate(self) -> None:
        """Raises EpkitError naming the first field out of range (the C++ validate)."""
        self.to_cpp().validate()


class Routing(NamedTuple):
    topk_idx: torch.Tensor      # [rows, K] int32: expert indices, best first
    topk_weights: torch.Tensor  # [rows, K] fp32


def route(logits: torch.Tensor, config: Optional[RouterConfig] = None, *, bias: Optional[torch.Tensor] = None,
          num_tokens: NumTokens = None, out: Optional[Routing] = None, num_tokens_out: Optional[torch.Tensor] = None,
          error: Optional[ErrorRecord] = None, **config_fields) -> Routing:
    """Each token's top-K experts and weights from gate logits [rows, E] (bf16 or fp32).

    config: a RouterConfig, or its fields as keywords. bias: [E] fp32 correction bias (grouped
    mode only). num_tokens: None (all rows), an int, or a one-element int32 device tensor; rows
    t >= m of the outputs are left untouched. num_tokens_out: optional one-element int32 device
    tensor the m this call used is written to (clamped), for later kernels' num_tokens.
    Returns (topk_idx [rows, K] int32, topk_weights [rows, K] fp32), in `out` if given.
    """
    if config is None:
        config = RouterConfig(**config_fields)
    elif config_fields:
        raise TypeError("pass either a RouterConfig or its fields as keywords, not both")
    rows = logits.shape[0]
    if out is None:
        config.validate()  # an EpkitError naming the field before its value sizes the outputs
        out = Routing(torch.empty((rows, config.topk), dtype=torch.int32, device=logits.device),
                      torch.empty((rows, config.topk), dtype=torch.float32, device=logits.device))
    m, m_dev = impl.num_tokens_arg(num_tokens, rows)
    args = (logits, bias, out.topk_idx, out.topk_weights, num_tokens_out, m, m_dev, config.mode_code(),
            int(config.num_experts), int(config.topk), int(config.num_groups), int(config.topk_groups),
            bool(config.renormalize), float(config.routed_scaling), _error_id(error))
    if _moe_ops.compiling():
        _moe_ops.route(*args)
    elif _ops.tracing():
        _route_untraced(*args)
    else:
        impl.route_now(*args)
    return out


_route_untraced = _ops.not_traced(impl.route_now)


# -- quantization ------------------------------------------------------------------------------

class Quantized(NamedTuple):
    q: torch.Tensor      # float8_e4m3fn, the shape of the input
    scale: torch.Tensor  # fp32 dequantisation scale of each 1x128 block: dequant = q * scale


class QuantizedWeights(NamedTuple):
    q: torch.Tensor          # float8_e4m3fn [(G,) N, K]
    scale_inv: torch.Tensor  # fp32 [(G,) ceil(N/128), ceil(K/128)]: dequant = q * scale_inv per 128x128 tile


def quantize(x: torch.Tensor, *, ue8m0: bool = False, num_tokens: NumTokens = None, out: Optional[Quantized] = None,
             error: Optional[ErrorRecord] = None) -> Quantized:
    """FP8 e4m3 1x128 block quantization of activations x [rows, H] bf16 (H % 16 == 0).

    Per block: scale = max(amax, 1e-10) / 448 (with ue8m0 its power-of-two ceiling), q =
    e4m3(x * (1 / scale)), the reciprocal rounded once per block. Returns (q [rows, H] e4m3fn,
    scale [rows, ceil(H/128)] fp32); rows t >= m are left untouched.
    """
    rows, h = x.shape[0], x.shape[-1]
    if out is None:
        out = Quantized(torch.empty((rows, h), dtype=FP8, device=x.device),
                        torch.empty((rows, _blocks(h)), dtype=torch.float32, device=x.device))
    m, m_dev = impl.num_tokens_arg(num_tokens, rows)
    args = (x, out.q, out.scale, bool(ue8m0), m, m_dev, _error_id(error))
    if _moe_ops.compiling():
        _moe_ops.quantize(*args)
    elif _ops.tracing():
        _quantize_untraced(*args)
    else:
        impl.quantize_now(*args)
    return out


_quantize_untraced = _ops.not_traced(impl.quantize_now)


def quantize_weights(w: torch.Tensor, *, ue8m0: bool = False,
                     out: Optional[QuantizedWeights] = None) -> QuantizedWeights:
    """FP8 e4m3 128x128 tile quantization of weights w [N, K] or [G, N, K] bf16 (the DeepSeek-V3
    checkpoint layout). Returns (q, scale_inv [(G,) ceil(N/128), ceil(K/128)] fp32), dequantised
    w = q * scale_inv."""
    if out is None:
        lead = tuple(w.shape[:-2])
        out = QuantizedWeights(torch.empty(w.shape, dtype=FP8, device=w.device),
                               torch.empty(lead + (_blocks(w.shape[-2]), _blocks(w.shape[-1])), dtype=torch.float32,
                                           device=w.device))
    args = (w, out.q, out.scale_inv, bool(ue8m0))
    if _moe_ops.compiling():
        _moe_ops.quantize_weights(*args)
    elif _ops.tracing():
        _quantize_weights_untraced(*args)
    else:
        impl.quantize_weights_now(*args)
    return out


_quantize_weights_untraced = _ops.not_traced(impl.quantize_weights_now)


# -- grouped GEMM ------------------------------------------------------------------------------

def grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                 expert_num_tokens: torch.Tensor, expert_offsets: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None, *, expected_m: int = 0, config: Optional[str] = None,
                 error: Optional[ErrorRecord] = None) -> torch.Tensor:
    """d_g[r] = dequant(a_g[r]) . dequant(b_g)^T in bf16 for the rows r < expert_num_tokens[g].

    a: masked [G, rows, K] or, with expert_offsets [G + 1] int32, packed [R, K] e4m3 (what
    dispatch writes); a_scale: [..., K/128] fp32 beside it; b: [G, N, K] e4m3 weights with b_scale
    [G, ceil(N/128), K/128] fp32 (weight_scale_inv); expert_num_tokens: [G] int32 on the device.
    Returns d (masked [G, rows, N], packed [R, N] bf16); rows not computed are left untouched.

    The GroupedGemm object of each (shape, layout, rows, expected_m, config) is made on the first
    call and cached; that first call must not be inside a CUDA graph capture (EpkitError). One
    stream at a time per cached object: its per-group arguments live in its workspace.
    expected_m picks the kernel config (0: rows, or R / G packed); config forces one by name
    (epkit.available_gemm_configs()).
    """
    packed = expert_offsets is not None
    if out is None:
        lead = (a.shape[0],) if packed else (a.shape[0], a.shape[1])
        out = torch.empty(lead + (b.shape[1],), dtype=torch.bfloat16, device=a.device)
    args = (a, a_scale, b, b_scale, out, expert_num_tokens, expert_offsets, int(expected_m), config or "",
            _error_id(error))
    if _moe_ops.compiling():
        _moe_ops.grouped_gemm(*args)
    elif _ops.tracing():
        _grouped_gemm_untraced(*args)
    else:
        impl.grouped_gemm_now(*args)
    return out


_grouped_gemm_untraced = _ops.not_traced(impl.grouped_gemm_now)


def available_gemm_configs() -> List[str]:
    """Names of the compiled grouped-GEMM configs (for grouped_gemm(config=...))."""
    return list(_C.available_gemm_configs())


def choose_gemm_config(num_groups: int, n: int, k: int, rows: int, layout: str = "masked", expected_m: int = 0) -> str:
    """The config the heuristic picks for a problem (what grouped_gemm uses without config=)."""
    return _C.choose_gemm_config(num_groups, n, k, _layout(layout), rows, expected_m)


def _layout(layout) -> "_C.ExpertLayout":
    return parse_enum("grouped GEMM", "layout", layout, _LAYOUTS, _C.ExpertLayout)


class GroupedGemm:
    """One grouped GEMM problem built explicitly (grouped_gemm() caches these itself).

    GroupedGemm(num_groups, n, k, rows, layout="masked", expected_m=0, config=None, device=None)
    allocates on `device`; create it outside any CUDA graph capture. run() takes the operands of
    grouped_gemm() and is capturable."""

    def __init__(self, num_groups: int, n: int, k: int, rows: int, layout="masked", expected_m: int = 0,
                 config: Optional[str] = None, device=None):
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        self._impl = _C.GroupedGemm(num_groups, n, k, _layout(layout), rows, expected_m, config, index)
        self.device = torch.device("cuda", index)

    @property
    def config(self) -> str:
        return self._impl.config

    @property
    def workspace_bytes(self) -> int:
        return self._impl.workspace_bytes

    def __repr__(self):
        return f"epkit.GroupedGemm({self._impl!r})"

    def run(self, a, a_scale, b, b_scale, expert_num_tokens, expert_offsets=None, out=None, *,
            error: Optional[ErrorRecord] = None) -> torch.Tensor:
        """Eager only (torch.compile breaks its graph here; use grouped_gemm() in compiled code)."""
        g = self._impl
        if out is None:
            lead = (g.rows,) if g.layout == _C.ExpertLayout.packed else (g.num_groups, g.rows)
            out = torch.empty(lead + (g.n,), dtype=torch.bfloat16, device=self.device)
        _run_untraced(g, a, a_scale, b, b_scale, out, expert_num_tokens, expert_offsets, _error_id(error))
        return out


_run_untraced = _ops.not_traced(impl.run_gemm)


# -- SiLU-mul + quantization -------------------------------------------------------------------

def silu_mul_quantize(h: torch.Tensor, expert_num_tokens: torch.Tensor, expert_offsets: Optional[torch.Tensor] = None,
                      *, ue8m0: bool = False, out: Optional[Quantized] = None,
                      error: Optional[ErrorRecord] = None) -> Quantized:
    """silu(gate) * up, then FP8 1x128 block quantization, over the expert rows that exist.

    h: masked [L, cap, 2I] or, with expert_offsets [L + 1] int32, packed [R, 2I] bf16 (the w13
    GEMM's output: gate h[..., :I], up h[..., I:]; I % 128 == 0); expert_num_tokens [L] int32 on
    the device. Returns (q [..., I] e4m3fn, scale [..., I/128] fp32); rows past an expert's count
    are neither read nor written.
    """
    if out is None:
        i = h.shape[-1] // 2
        lead = tuple(h.shape[:-1])
        out = Quantized(torch.empty(lead + (i,), dtype=FP8, device=h.device),
                        torch.empty(lead + (i // SCALE_BLOCK,), dtype=torch.float32, device=h.device))
    args = (h, out.q, out.scale, expert_num_tokens, expert_offsets, bool(ue8m0), _error_id(error))
    if _moe_ops.compiling():
        _moe_ops.silu_mul_quantize(*args)
    elif _ops.tracing():
        _silu_untraced(*args)
    else:
        impl.silu_mul_quantize_now(*args)
    return out


_silu_untraced = _ops.not_traced(impl.silu_mul_quantize_now)


# -- gate projection ---------------------------------------------------------------------------

class GateProjection:
    """logits [m, E] fp32 = x [m, H] bf16 . w [E, H]^T bf16 through cuBLASLt (fp32 accumulation).

    GateProjection(hidden, num_experts, max_tokens, device=None) owns its cuBLASLt workspace:
    create it outside any CUDA graph capture. Calling it is capturable once it has run at that m
    (the first run at an m asks cuBLASLt's heuristic). Eager only under torch.compile (a graph break)."""

    def __init__(self, hidden: int, num_experts: int, max_tokens: int, device=None):
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        self._impl = _C.GateProjection(hidden, num_experts, max_tokens, index)
        self.device = torch.device("cuda", index)
        self.hidden, self.num_experts, self.max_tokens = hidden, num_experts, max_tokens

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor] = None,
                 num_tokens: Optional[int] = None) -> torch.Tensor:
        if out is None:
            out = torch.empty((x.shape[0], self.num_experts), dtype=torch.float32, device=x.device)
        m = x.shape[0] if num_tokens is None else int(num_tokens)
        _gate_untraced(self._impl, x, w, out, m)
        return out


def _gate_now(g, x, w, out, m):
    g.run(arg(x, "x"), arg(w, "w"), arg(out, "logits"), m, impl.stream_of(g.device))


_gate_untraced = _ops.not_traced(_gate_now)
