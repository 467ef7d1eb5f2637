"""The eager implementations of the MoE expert-compute ops: torch tensors to the extension, on the
current stream of the tensors' device. Both the public functions of epkit.moe (when not traced)
and the torch custom ops of epkit._moe_ops (when traced by torch.compile) end here.

Objects the kernels need are made here once and cached: one GroupedGemm per (device, shape,
layout, rows, expected_m, config) and one default ErrorRecord per device. Creating a GroupedGemm
allocates device memory, so it may not happen inside a CUDA graph capture; see grouped_gemm_now.
"""

import re
from typing import Dict, Optional, Tuple

import torch

from . import _ops
from ._lib import EpkitError, _C
from ._tensors import arg

_RouterMode = _C.RouterMode
ROUTER_MODES = {"softmax_topk": int(_RouterMode.softmax_topk), "grouped_topk": int(_RouterMode.grouped_topk)}
_LAYOUT_MASKED, _LAYOUT_PACKED = int(_C.ExpertLayout.masked), int(_C.ExpertLayout.packed)

_default_records: Dict[int, "_C.ErrorRecord"] = {}
_gemms: Dict[tuple, "_C.GroupedGemm"] = {}


def stream_of(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def device_of(t: torch.Tensor, what: str) -> int:
    if not isinstance(t, torch.Tensor):
        raise EpkitError(f"{what} must be a torch tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise EpkitError(f"{what} must be on a CUDA device, got {t.device}")
    return t.device.index


def default_record(device: int) -> "_C.ErrorRecord":
    """The ErrorRecord that calls given no `error` report into (one per device; epkit.moe.check)."""
    rec = _default_records.get(device)
    if rec is None:
        rec = _default_records[device] = _C.ErrorRecord(device)
    return rec


def record(error_id: int, device: int) -> "_C.ErrorRecord":
    """The C++ record behind an op's `error` argument: 0 = the device's default record, else the
    id of an epkit.ErrorRecord (ops take no Python objects)."""
    if error_id == 0:
        return default_record(device)
    obj = _ops._objects.get(error_id)
    if obj is None:
        raise EpkitError(f"epkit op called with ErrorRecord #{error_id}, which no longer exists")
    return obj._impl


def _router_config(mode: int, num_experts: int, topk: int, num_groups: int, topk_groups: int, renormalize: bool,
                   routed_scaling: float) -> "_C.RouterConfig":
    c = _C.RouterConfig()
    c.mode = _RouterMode(mode)
    c.num_experts, c.topk, c.num_groups, c.topk_groups = num_experts, topk, num_groups, topk_groups
    c.renormalize, c.routed_scaling = renormalize, routed_scaling
    return c


def route_now(logits, bias, topk_idx, topk_weights, num_tokens_out, num_tokens: int, num_tokens_device,
              router_mode: int, num_experts: int, topk: int, num_groups: int, topk_groups: int, renormalize: bool,
              routed_scaling: float, error: int) -> None:
    dev = device_of(logits, "logits")
    cfg = _router_config(router_mode, num_experts, topk, num_groups, topk_groups, renormalize, routed_scaling)
    _C.route(cfg, arg(logits, "logits"), arg(bias, "bias"), num_tokens, arg(num_tokens_device, "num_tokens"),
             arg(num_tokens_out, "num_tokens_out"), arg(topk_idx, "topk_idx"), arg(topk_weights, "topk_weights"),
             record(error, dev), dev, stream_of(dev))


def quantize_now(x, q, scale, ue8m0: bool, num_tokens: int, num_tokens_device, error: int) -> None:
    dev = device_of(x, "x")
    _C.quantize_activations(arg(x, "x"), arg(q, "out"), arg(scale, "scale"), ue8m0, num_tokens,
                            arg(num_tokens_device, "num_tokens"), record(error, dev), dev, stream_of(dev))


def quantize_weights_now(w, q, scale_inv, ue8m0: bool) -> None:
    dev = device_of(w, "w")
    _C.quantize_weights(arg(w, "w"), arg(q, "out"), arg(scale_inv, "scale_inv"), ue8m0, dev, stream_of(dev))


# The C++ argument structs name two tensors differently from the Python functions: errors from the
# C++ checks are re-raised with the Python name first (the C++ field after it in parentheses), so that
# every EpkitError names the argument the caller passed.
_PY_NAMES = {"silu_mul_quantize": (("in", "h"),), "grouped GEMM": (("d", "out"),)}


def python_names(e: "EpkitError", call: str) -> "EpkitError":
    msg = str(e)
    for cpp, py in _PY_NAMES[call]:
        msg = re.sub(rf"({re.escape(call)}: ){cpp}(?=[ ']|$)", rf"\g<1>{py} ({cpp})", msg)
    return e if msg == str(e) else EpkitError(msg)


def silu_mul_quantize_now(h, q, scale, expert_num_tokens, expert_offsets, ue8m0: bool, error: int) -> None:
    dev = device_of(h, "h")
    layout = _C.ExpertLayout.packed if expert_offsets is not None else _C.ExpertLayout.masked
    try:
        _C.silu_mul_quantize(layout, arg(h, "h"), arg(q, "out"), arg(scale, "scale"),
                             arg(expert_num_tokens, "expert_num_tokens"), arg(expert_offsets, "expert_offsets"), ue8m0,
                             record(error, dev), dev, stream_of(dev))
    except EpkitError as e:
        raise python_names(e, "silu_mul_quantize") from None


def gemm_problem(a: torch.Tensor, b: torch.Tensor, packed: bool) -> Tuple[int, int, int, int, int]:
    """(num_groups, n, k, layout, rows) of a grouped GEMM call: b is [G, N, K]; a is masked
    [G, rows, K] or packed [R, K]."""
    if b.dim() != 3:
        raise EpkitError(f"grouped_gemm: b must be [G, N, K] (fp8 weights), got shape {tuple(b.shape)}")
    if a.dim() != (2 if packed else 3):
        want = "[R, K] with expert_offsets (packed)" if packed else "[G, rows, K] (masked, no expert_offsets)"
        raise EpkitError(f"grouped_gemm: a must be {want}, got shape {tuple(a.shape)}")
    rows = a.shape[0] if packed else a.shape[1]
    return int(b.shape[0]), int(b.shape[1]), int(b.shape[2]), _LAYOUT_PACKED if packed else _LAYOUT_MASKED, int(rows)


def gemm_object(device: int, num_groups: int, n: int, k: int, layout: int, rows: int, expected_m: int,
                config: str) -> "_C.GroupedGemm":
    """The cached GroupedGemm of one problem, made on first use: outside any CUDA graph capture."""
    key = (device, num_groups, n, k, layout, rows, expected_m, config)
    g = _gemms.get(key)
    if g is not None:
        return g
    lay = _C.ExpertLayout(layout)
    with torch.cuda.device(device):
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        raise EpkitError(
            f"grouped_gemm: the first call for GroupedGemm shape (num_groups={num_groups}, n={n}, k={k}, "
            f"layout={lay.name}, rows={rows}, expected_m={expected_m}, config={config or 'heuristic'}) on cuda:{device} "
            "happens inside a CUDA graph capture, but creating its GroupedGemm allocates device memory: run the call "
            "once before capturing (or epkit.GroupedGemm(...) outside the capture)")
    g = _C.GroupedGemm(num_groups, n, k, lay, rows, expected_m, config or None, device)
    _gemms[key] = g
    return g


def grouped_gemm_now(a, a_scale, b, b_scale, d, expert_num_tokens, expert_offsets, expected_m: int, config: str,
                     error: int) -> None:
    dev = device_of(a, "a")
    g = gemm_object(dev, *gemm_problem(a, b, expert_offsets is not None), expected_m, config)
    run_gemm(g, a, a_scale, b, b_scale, d, expert_num_tokens, expert_offsets, error)


def run_gemm(g: "_C.GroupedGemm", a, a_scale, b, b_scale, d, expert_num_tokens, expert_offsets, error: int) -> None:
    dev = g.device
    try:
        g.run(arg(a, "a"), arg(a_scale, "a_scale"), arg(b, "b"), arg(b_scale, "b_scale"), arg(d, "out"),
              arg(expert_num_tokens, "expert_num_tokens"), arg(expert_offsets, "expert_offsets"), record(error, dev),
              stream_of(dev))
    except EpkitError as e:
        raise python_names(e, "grouped GEMM") from None


def num_tokens_arg(num_tokens, rows: int) -> Tuple[int, Optional[torch.Tensor]]:
    """(host m or -1, device count or None) from None (all rows), an int, or a one-element int32
    device tensor (one CUDA graph then serves every m)."""
    if num_tokens is None:
        return int(rows), None
    if isinstance(num_tokens, torch.Tensor):
        return -1, num_tokens
    return int(num_tokens), None
