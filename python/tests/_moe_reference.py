"""Torch references of the MoE expert compute (include/epkit/moe/*.hpp): the oracles of test_moe.py.

The kernels' fp32 arithmetic is specified operation by operation (src/moe/moe_math.hpp): each step
is one correctly rounded IEEE fp32 operation, and e^x is a fixed polynomial, not libm's or CUDA's
exp. Here every fp32 operation is computed in float64 and rounded once to float32, which is the
correctly rounded fp32 result: for +, -, *, / of two fp32 values a float64 result (53 >= 2 * 24 + 2
bits) rounds to the same float32 as the exact one. fma is a * b (exact in float64) plus c with the
sum rounded to odd in float64 (TwoSum gives the sum's exact error), which then rounds to float32
correctly. So router indices and weights, quantized bytes and scales compare exactly.

Everything here works on CPU and CUDA tensors alike; none of it may run under torch.compile (a
fused a * b + c would change the roundings). Divisions always take two tensors: CUDA torch divides
by a Python scalar as a multiplication by its reciprocal.
"""

import struct
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

INF = float("inf")


def f32(bits: int) -> float:
    """The fp32 value with these bits, as an (exact) Python float."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# Constants of src/moe/moe_math.hpp by their fp32 bits (the C++ literals rounded to fp32 once).
EXP_LO, EXP_HI = f32(0xC2AE0000), f32(0x42B170A4)            # -87, 88.72f
MAGIC = f32(0x4B400000)                                       # 1.5 * 2^23
LOG2E = f32(0x3FB8AA3B)                                       # 1.44269502f
NEG_LN2_HI, NEG_LN2_LO = f32(0xBF317200), f32(0xB5BFBE8E)     # -0.693145751953125f, -1.42860677e-06f
POLY = [f32(0x3AB6BAB3), f32(0x3C0937ED), f32(0x3D2AAA56), f32(0x3E2AAA02), 0.5, 1.0, 1.0]
E4M3_MAX = 448.0
QUANT_EPS = f32(0x2EDBE6FF)                                   # 1e-10f


def _d(v, like: torch.Tensor) -> torch.Tensor:
    """v (a tensor or a Python float holding an fp32 value) as a float64 tensor on like's device."""
    if isinstance(v, torch.Tensor):
        return v.double()
    return torch.full_like(like, v, dtype=torch.float64)


def _like(*vs) -> torch.Tensor:
    for v in vs:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError("at least one tensor operand is needed")


def fadd(a, b):
    t = _like(a, b)
    return (_d(a, t) + _d(b, t)).float()


def fsub(a, b):
    t = _like(a, b)
    return (_d(a, t) - _d(b, t)).float()


def fmul(a, b):
    t = _like(a, b)
    return (_d(a, t) * _d(b, t)).float()


def fdiv(a, b):
    t = _like(a, b)
    return (_d(a, t) / _d(b, t)).float()


def ffma(a, b, c):
    """fp32 fma(a, b, c), correctly rounded (see the module docstring)."""
    t = _like(a, b, c)
    p = _d(a, t) * _d(b, t)  # exact: 48 significant bits
    c = _d(c, t)
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)  # TwoSum: p + c == s + e exactly
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(e > 0, torch.full_like(s, INF), torch.full_like(s, -INF))
    s = torch.where((e != 0) & even, torch.nextafter(s, toward), s)  # round to odd
    return s.float()


def bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bits as int64 in [0, 2^32)."""
    return x.float().contiguous().view(torch.int32).long() & 0xFFFFFFFF


def from_bits(u: torch.Tensor) -> torch.Tensor:
    """float32 from bits held as int64 in [0, 2^32)."""
    return torch.where(u >= 2**31, u - 2**32, u).int().view(torch.float32)


def fclamp(x, lo: float, hi: float):
    """fminf(fmaxf(x, lo), hi): a NaN x gives lo."""
    return torch.where(torch.isnan(x), torch.full_like(x, lo), x.clamp(lo, hi))


def exp(x: torch.Tensor) -> torch.Tensor:
    """moe::math::exp: Cody-Waite reduction and a degree-6 polynomial, bit for bit."""
    x = x.float()
    xc = fclamp(x, EXP_LO, EXP_HI)
    t = ffma(xc, LOG2E, MAGIC)
    j = fsub(t, MAGIC)
    n = bits(t) - bits(torch.full_like(t, MAGIC))  # j as an integer, in [-126, 128]
    r = ffma(j, NEG_LN2_HI, xc)
    r = ffma(j, NEG_LN2_LO, r)
    p = torch.full_like(r, POLY[0])
    for c in POLY[1:]:
        p = ffma(p, r, c)
    y = from_bits(bits(p) + n * (1 << 23))  # the exponent field stays in [1, 254]: no wrap
    y = torch.where(x > EXP_HI, torch.full_like(y, INF), y)
    y = torch.where(x < EXP_LO, torch.zeros_like(y), y)
    return torch.where(torch.isnan(x), x, y)


def sigmoid(x):
    return fdiv(1.0, fadd(1.0, exp(-x)))


def silu_mul(g, u):
    return fmul(fdiv(g, fadd(1.0, exp(-g))), u)


def order_key(v: torch.Tensor) -> torch.Tensor:
    """moe::math::order_key as int64: larger key = larger value, -0 as +0, NaN below every number (1)."""
    v = torch.where(v == 0, torch.zeros_like(v), v.float())
    u = bits(v)
    key = torch.where((u & 0x80000000) != 0, 0xFFFFFFFF - u, u | 0x80000000)
    return torch.where(torch.isnan(v), torch.ones_like(key), key)


def ranked(keys: torch.Tensor) -> torch.Tensor:
    """Indices along the last dim ordered best first: larger key, then lower index (the tie rule)."""
    n = keys.shape[-1]
    assert n <= 1024
    idx = torch.arange(n, device=keys.device)
    return torch.argsort(keys * 1024 + (1023 - idx), dim=-1, descending=True)


# -- router ------------------------------------------------------------------------------------

@dataclass
class Router:
    mode: str
    num_experts: int
    topk: int
    num_groups: int = 1
    topk_groups: int = 1
    renormalize: bool = True
    routed_scaling: float = 1.0


def route(cfg: Router, logits: torch.Tensor, bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx int32 [m, K], topk_weights fp32 [m, K]) from logits [m, E] (their fp32 values)."""
    lg = logits.float()
    m, E = lg.shape
    K = cfg.topk
    scaling = struct.unpack("<f", struct.pack("<f", cfg.routed_scaling))[0]
    if cfg.mode == "softmax_topk":
        order = ranked(order_key(lg))
        top = order[:, :K]
        vmax = lg.gather(1, order[:, :1])
        x = exp(fsub(lg.gather(1, top), vmax))
        total = torch.zeros(m, dtype=torch.float32, device=lg.device)
        if cfg.renormalize:
            for k in range(K):
                total = fadd(total, x[:, k])
        else:  # the kernel sums in another order: callers compare these weights with a tolerance
            ex = exp(fsub(lg, vmax))
            for e in range(E):
                total = fadd(total, ex[:, e])
        w = fmul(fdiv(x, total[:, None].expand_as(x)), scaling)
        return top.int(), w
    s = sigmoid(lg)
    sb = fadd(s, bias.float()[None, :].expand_as(s)) if bias is not None else s
    G, gs = cfg.num_groups, E // cfg.num_groups
    sbg = sb.reshape(m, G, gs)
    o = ranked(order_key(sbg))
    top1 = sbg.gather(2, o[..., :1])
    gscore = top1 if gs == 1 else fadd(top1, sbg.gather(2, o[..., 1:2]))
    gorder = ranked(order_key(gscore[..., 0]))
    kept = torch.zeros(m, G, dtype=torch.bool, device=lg.device)
    kept.scatter_(1, gorder[:, :cfg.topk_groups], True)
    keys = torch.where(kept.repeat_interleave(gs, dim=1), order_key(sb), torch.zeros_like(order_key(sb)))
    top = ranked(keys)[:, :K]
    ssel = s.gather(1, top)
    total = torch.zeros(m, dtype=torch.float32, device=lg.device)
    for k in range(K):
        total = fadd(total, ssel[:, k])
    w = fmul(fdiv(ssel, total[:, None].expand_as(ssel)), scaling)
    return top.int(), w


# -- quantization ------------------------------------------------------------------------------

def block_scale(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """max(amax, 1e-10f) / 448, or its power-of-two ceiling (exactly: by the bits)."""
    a = torch.where(amax < QUANT_EPS, torch.full_like(amax, QUANT_EPS), amax.float())
    s = fdiv(a, E4M3_MAX)
    if not ue8m0:
        return s
    u = bits(s)
    special = (u & 0x7F800000) == 0x7F800000
    up = torch.where((u & 0x007FFFFF) != 0, (u & 0xFF800000) + 0x00800000, u)
    return from_bits(torch.where(special, u, up))


def _quantize_blocks(v: torch.Tensor, amax: torch.Tensor, ue8m0: bool):
    """v [..., nb, 128] fp32, amax [..., nb] -> (q e4m3fn [..., nb, 128], scale [..., nb])."""
    s = block_scale(amax, ue8m0)
    inv = fdiv(1.0, s)
    q = fmul(v, inv[..., None].expand_as(v)).to(torch.float8_e4m3fn)
    return q, s


def quantize(x: torch.Tensor, ue8m0: bool = False):
    """quantize_activations for x [m, H] bf16: (q [m, H] e4m3fn, scale [m, ceil(H/128)] fp32)."""
    m, H = x.shape
    nb = (H + 127) // 128
    v = torch.zeros(m, nb * 128, dtype=torch.float32, device=x.device)  # zeros do not change an amax
    v[:, :H] = x.float()
    v = v.view(m, nb, 128)
    q, s = _quantize_blocks(v, v.abs().amax(-1), ue8m0)
    return q.view(m, nb * 128)[:, :H].contiguous(), s


def quantize_weights(w: torch.Tensor, ue8m0: bool = False):
    """quantize_weights for w [N, K] or [G, N, K] bf16: (q e4m3fn, scale_inv [(G,) ceil(N/128), ceil(K/128)])."""
    batched = w.dim() == 3
    w3 = w if batched else w[None]
    G, N, K = w3.shape
    nt, kt = (N + 127) // 128, (K + 127) // 128
    v = torch.zeros(G, nt * 128, kt * 128, dtype=torch.float32, device=w.device)
    v[:, :N, :K] = w3.float()
    tiles = v.view(G, nt, 128, kt, 128).permute(0, 1, 3, 2, 4).reshape(G, nt, kt, 128 * 128)
    q, s = _quantize_blocks(tiles, tiles.abs().amax(-1), ue8m0)
    q = q.view(G, nt, kt, 128, 128).permute(0, 1, 3, 2, 4).reshape(G, nt * 128, kt * 128)[:, :N, :K].contiguous()
    return (q, s) if batched else (q[0], s[0])


def silu_mul_quantize(h: torch.Tensor, ue8m0: bool = False):
    """silu_mul_quantize of rows h [r, 2I] bf16 (gate, then up): (q [r, I] e4m3fn, scale [r, I/128])."""
    r, two_i = h.shape
    i = two_i // 2
    act = silu_mul(h[:, :i].float(), h[:, i:].float()).view(r, i // 128, 128)
    q, s = _quantize_blocks(act, act.abs().amax(-1), ue8m0)
    return q.view(r, i), s


# -- dequantisation and the GEMM ---------------------------------------------------------------

def dequant_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[..., K] e4m3 codes with [..., ceil(K/128)] scales -> float64."""
    k = q.shape[-1]
    return q.float().double() * scale.double().repeat_interleave(128, dim=-1)[..., :k]


def dequant_weight(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """[(G,) N, K] e4m3 with [(G,) ceil(N/128), ceil(K/128)] tile scales -> float64."""
    n, k = q.shape[-2], q.shape[-1]
    s = scale_inv.double().repeat_interleave(128, dim=-2)[..., :n, :].repeat_interleave(128, dim=-1)[..., :k]
    return q.float().double() * s


def gemm_rows(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor):
    """(ref, abs) [r, N] float64 for rows a [r, K] and one expert's weights b [N, K]:
    ref = deq(a) . deq(b)^T, abs = |deq(a)| . |deq(b)|^T (what accumulation error is measured against)."""
    da, db = dequant_rows(a, a_scale), dequant_weight(b, b_scale)
    return da @ db.T, da.abs() @ db.abs().T
