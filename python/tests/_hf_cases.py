"""Cases and oracles of test_transformers.py: transformers MoE blocks with exactly-FP8 weights, an
emulation of epkit's documented arithmetic, routing near-ties, and a torch stand-in for epkit's
kernels that lets the CPU tests run epkit.transformers' own logic without the compiled extension.

Exactly-FP8 weights. A block's bf16 weights are set to values that epkit's weight quantizer maps
back to the same e4m3 codes and scales: random weights quantized with power-of-two (UE8M0) tile
scales, then one element of each 128x128 tile set to the e4m3 maximum 448. The tile's amax is then
448 * 2^k, so epkit's scale amax / 448 is the power of two 2^k exactly, every code is recovered
exactly, and the dequantised values (e4m3 times a power of two) are exact in bf16. The transformers
block with these weights and epkit compute with the same weights: what remains between them is
epkit's FP8 rounding of the activations (and accumulation order).
"""

import math
import os
import sys
import types
from pathlib import Path
from typing import NamedTuple, Optional

import torch

import _moe_reference as R

FP8 = torch.float8_e4m3fn
E4M3_448 = 0x7E  # the e4m3fn code of +448
FAMILIES = ("deepseek_v3", "qwen3_moe", "mixtral")
SRC = Path(__file__).resolve().parents[1] / "epkit"


def import_epkit_transformers():
    """(epkit.transformers, have_extension). Where the compiled extension is missing (a machine
    without the CUDA build) `import epkit` fails; the pure-Python module is then loaded from the
    source tree as `_epkit_src.transformers` (a package without epkit/__init__.py), which is enough
    for registration and the config mapping. sys.modules["epkit"] is left alone. An importable
    epkit whose folder lacks transformers.py (a build tree configured before the file existed: CMake
    links the .py files at configure time) gets this source folder on its __path__."""
    import importlib
    try:
        import epkit
    except ImportError as e:
        note = f"{type(e).__name__}: {e}"
    else:
        if not any((Path(p) / "transformers.py").exists() for p in epkit.__path__):
            epkit.__path__.append(str(SRC))
            print(f"note: {epkit.__path__[0]} has no transformers.py (re-run CMake); using {SRC}", file=sys.stderr)
        return importlib.import_module("epkit.transformers"), True
    if "_epkit_src" not in sys.modules:
        pkg = types.ModuleType("_epkit_src")
        pkg.__path__ = [str(SRC)]
        sys.modules["_epkit_src"] = pkg
    et = importlib.import_module("_epkit_src.transformers")
    et._loaded_without_extension = note
    return et, False


def moe_layer_config_fields():
    """The field names of epkit.MoELayerConfig, read from python/epkit/moe_layer.py's source (the
    dataclass cannot be imported without the compiled extension)."""
    import ast
    tree = ast.parse((SRC / "moe_layer.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "MoELayerConfig":
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
    raise AssertionError("no MoELayerConfig in moe_layer.py")


# -- configs and blocks ------------------------------------------------------------------------

def hf_config(family: str, small: bool = False, **over):
    """A transformers config of the family at the real model's sizes (DeepSeek-V3 H 7168 / I 2048,
    Qwen3-30B-A3B H 2048 / I 768, Mixtral-8x7B H 4096 / I 14336), or a CPU-sized one (small)."""
    import transformers as tf
    if family == "deepseek_v3":
        kw = dict(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8,
                  n_group=8, topk_group=4, routed_scaling_factor=2.5, n_shared_experts=1, norm_topk_prob=True)
        if small:
            kw.update(hidden_size=256, moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4,
                      n_group=4, topk_group=2)
        cls = tf.DeepseekV3Config
    elif family == "qwen3_moe":
        kw = dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                  norm_topk_prob=True)
        if small:
            kw.update(hidden_size=256, moe_intermediate_size=128, num_experts=12, num_experts_per_tok=3)
        cls = tf.Qwen3MoeConfig
    elif family == "mixtral":
        kw = dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2)
        if small:
            kw.update(hidden_size=256, intermediate_size=256, num_local_experts=6)
        cls = tf.MixtralConfig
    else:
        raise ValueError(family)
    kw.update(over)
    cfg = cls(**kw)
    cfg._experts_implementation = "eager"
    return cfg


def block_class(family: str):
    import importlib
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    return getattr(mod, {"deepseek_v3": "DeepseekV3MoE", "qwen3_moe": "Qwen3MoeSparseMoeBlock",
                         "mixtral": "MixtralSparseMoeBlock"}[family])


class Fp8(NamedTuple):
    q: torch.Tensor          # e4m3 [.., N, K]
    scale_inv: torch.Tensor  # fp32 [.., N/128, K/128], powers of two
    deq: torch.Tensor        # bf16, exactly q * scale_inv


def exact_fp8(w: torch.Tensor, quantize_weights) -> Fp8:
    """Weights that quantize exactly (see the module docstring): from w [.., N, K] (N, K multiples of
    128) with quantize_weights(w, ue8m0=True) -> (q, scale_inv)."""
    q, s = quantize_weights(w.to(torch.bfloat16).contiguous(), ue8m0=True)
    q = q.clone()
    q.view(torch.uint8)[..., ::128, ::128] = E4M3_448
    exact = q.float() * s.float().repeat_interleave(128, -2).repeat_interleave(128, -1)
    deq = exact.to(torch.bfloat16)
    assert torch.equal(deq.float(), exact), "dequantised weights are not exact in bf16"
    return Fp8(q, s.float(), deq)


def random_exact_fp8(shape, std: float, g: torch.Generator, device, quantize_weights, chunk: int = 8,
                     out: Optional[torch.Tensor] = None) -> Fp8:
    """exact_fp8 of N(0, std^2) weights of `shape`, [E, N, K] made `chunk` experts at a time (small
    temporaries at DeepSeek-V3's sizes). With `out` (a bf16 tensor of `shape`, e.g. the block's
    parameter), the dequantised weights are written there and Fp8.deq is `out` (no second copy)."""
    if len(shape) == 2:
        f = exact_fp8(torch.randn(*shape, generator=g, device=device) * std, quantize_weights)
        if out is None:
            return f
        out.copy_(f.deq)
        return Fp8(f.q, f.scale_inv, out)
    E, N, K = shape
    q = torch.empty(E, N, K, dtype=FP8, device=device)
    s = torch.empty(E, N // 128, K // 128, dtype=torch.float32, device=device)
    deq = torch.empty(E, N, K, dtype=torch.bfloat16, device=device) if out is None else out
    for e0 in range(0, E, chunk):
        e1 = min(E, e0 + chunk)
        part = exact_fp8(torch.randn(e1 - e0, N, K, generator=g, device=device) * std, quantize_weights)
        q[e0:e1], s[e0:e1], deq[e0:e1] = part.q, part.scale_inv, part.deq
        del part
    return Fp8(q, s, deq)


def dequant(f: Fp8, e: int) -> torch.Tensor:
    """Expert e's exact bf16 weights from its codes and scales (to restore a poisoned expert:
    Fp8.deq may be the block's own parameter)."""
    return (f.q[e].float() * f.scale_inv[e].repeat_interleave(128, -2).repeat_interleave(128, -1)).to(torch.bfloat16)


def ref_quantize_weights(w, ue8m0=False):
    return R.quantize_weights(w, ue8m0)


class Block(NamedTuple):
    block: torch.nn.Module
    cfg: object
    w13: Fp8   # routed experts [E, 2I, H]
    w2: Fp8    # [E, H, I]
    shared13: Optional[Fp8]  # DeepSeek's shared expert [2Is, H] (gate rows, then up)
    shared2: Optional[Fp8]


def make_block(family: str, cfg, device, seed: int, quantize_weights=ref_quantize_weights,
               dtype=torch.bfloat16) -> Block:
    """The family's transformers MoE block (eval mode) on `device` with exactly-FP8 expert weights
    (and shared expert), a router whose logits have a spread of about 1.5, and, for DeepSeek-V3, an
    fp32 e_score_correction_bias as from_pretrained keeps it."""
    g = torch.Generator(device=device).manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # no fp32 copy of DeepSeek-V3's experts on the way
    try:
        with torch.device(device):
            block = block_class(family)(cfg)
    finally:
        torch.set_default_dtype(old)
    block = block.to(dtype).eval()
    ex = block.experts
    E, two_i, H = ex.gate_up_proj.shape
    inter = two_i // 2

    def randn(*shape, std):
        return torch.randn(*shape, generator=g, device=device) * std

    shared13 = shared2 = None
    with torch.no_grad():
        w13 = random_exact_fp8((E, two_i, H), 1 / math.sqrt(H), g, device, quantize_weights, out=ex.gate_up_proj.data)
        w2 = random_exact_fp8((E, H, inter), 1 / math.sqrt(inter), g, device, quantize_weights, out=ex.down_proj.data)
        block.gate.weight.copy_(randn(E, H, std=1.5 / math.sqrt(H)))
        if family == "deepseek_v3":
            block.gate.e_score_correction_bias = (randn(E, std=0.05)).float()
            sh = block.shared_experts
            Is = sh.intermediate_size
            shared13 = random_exact_fp8((2 * Is, H), 1 / math.sqrt(H), g, device, quantize_weights)
            shared2 = random_exact_fp8((H, Is), 1 / math.sqrt(Is), g, device, quantize_weights,
                                       out=sh.down_proj.weight.data)
            sh.gate_proj.weight.copy_(shared13.deq[:Is])
            sh.up_proj.weight.copy_(shared13.deq[Is:])
    return Block(block, cfg, w13, w2, shared13, shared2)


def set_impl(blk: Block, impl: str):
    blk.cfg._experts_implementation = impl
    blk.block.experts.config._experts_implementation = impl


def tokens(T: int, H: int, device, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(T, H, generator=g, device=device).to(torch.bfloat16)


def route(blk: Block, x: torch.Tensor):
    """(top_k_index, top_k_weights, router_logits) of the block's own router for x [T, H]."""
    logits, w, idx = blk.block.gate(x)
    return idx, w, logits


# -- emulation of epkit's arithmetic -----------------------------------------------------------

def _expert_mlp(xd: torch.Tensor, w13: Fp8, w2: Fp8, e: Optional[int]) -> torch.Tensor:
    """One expert as epkit computes it, from dequantised 1x128-block activations xd [r, H] float64:
    h = bf16(xd . W13^T); a = e4m3 1x128 blocks of silu(gate) * up; y = bf16(a . W2^T)."""
    b13 = R.dequant_weight(w13.q[e] if e is not None else w13.q, w13.scale_inv[e] if e is not None else w13.scale_inv)
    h = (xd @ b13.T).to(torch.bfloat16)
    del b13
    aq, asc = R.silu_mul_quantize(h)
    b2 = R.dequant_weight(w2.q[e] if e is not None else w2.q, w2.scale_inv[e] if e is not None else w2.scale_inv)
    return (R.dequant_rows(aq, asc) @ b2.T).to(torch.bfloat16)


def emulate_experts(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, w13: Fp8, w2: Fp8) -> torch.Tensor:
    """epkit's routed experts in float64 from its documented roundings: x quantized in 1x128 blocks
    (the reference quantizer, bit-exact with epkit's), each expert as _expert_mlp, then
    out[t] = bf16(sum_k w[t, k] * y(t, k)); indices outside [0, E) add nothing."""
    T, H = x.shape
    E = w13.q.shape[0]
    xq, xs = R.quantize(x.to(torch.bfloat16))
    xd = R.dequant_rows(xq, xs)
    out = torch.zeros(T, H, dtype=torch.float64, device=x.device)
    idx, w = idx.long(), w.double()
    for e in torch.unique(idx).tolist():
        if not 0 <= e < E:
            continue
        t, k = torch.nonzero(idx == e, as_tuple=True)
        y = _expert_mlp(xd[t], w13, w2, e)
        out.index_add_(0, t, y.double() * w[t, k, None])
    return out.to(torch.bfloat16)


def emulate_shared(x: torch.Tensor, w13: Fp8, w2: Fp8) -> torch.Tensor:
    xq, xs = R.quantize(x.to(torch.bfloat16))
    return _expert_mlp(R.dequant_rows(xq, xs), w13, w2, None)


# -- comparisons -------------------------------------------------------------------------------

def rel_frob(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def row_rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double(), b.double()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-300)


def same_sets(i1: torch.Tensor, i2: torch.Tensor) -> torch.Tensor:
    """Per row: whether the two index rows hold the same experts (in any order)."""
    return (i1.long().sort(-1).values == i2.long().sort(-1).values).all(-1)


def near_ties(family: str, cfg, logits: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Per token: whether its top-k choice sits on a near-tie that the two routers' roundings may
    break differently. logits [T, E] fp32 (epkit's).

    softmax (Qwen3-MoE, Mixtral): transformers rounds the logits to bf16 (2^-9 relative each) and
    takes its top-k of them; epkit ranks the fp32 logits. A pair of logits closer than
    2^-7 max(|a|, |b|) + 1e-3 may order differently (twice the rounding, plus accumulation order).
    DeepSeek-V3: both sides compute fp32 logits from the same bf16 products (differing only in
    accumulation order, ~1e-6); a gap below 1e-4 between the kept and the first dropped group
    score, or between the K-th and (K+1)-th expert score among the kept groups, is a near-tie.
    """
    lg = logits.double()
    T, E = lg.shape
    K = cfg.num_experts_per_tok
    if family != "deepseek_v3":
        top = lg.sort(-1, descending=True).values
        if K >= E:
            return torch.zeros(T, dtype=torch.bool, device=lg.device)
        a, b = top[:, K - 1], top[:, K]
        return (a - b) <= 2.0 ** -7 * torch.maximum(a.abs(), b.abs()) + 1e-3
    s = torch.sigmoid(lg) + (bias.double() if bias is not None else 0)
    G, TG = cfg.n_group, cfg.topk_group
    gs = s.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)
    gsorted = gs.sort(-1, descending=True)
    tie = torch.zeros(T, dtype=torch.bool, device=lg.device)
    if TG < G:
        tie |= (gsorted.values[:, TG - 1] - gsorted.values[:, TG]) < 1e-4
    kept = torch.zeros(T, G, dtype=torch.bool, device=lg.device).scatter_(1, gsorted.indices[:, :TG], True)
    cand = s.masked_fill(~kept.repeat_interleave(E // G, dim=1), -float("inf")).sort(-1, descending=True).values
    if K < TG * (E // G):
        tie |= (cand[:, K - 1] - cand[:, K]) < 1e-4
    return tie


# -- a torch stand-in for epkit's kernels (CPU tests) ------------------------------------------

class _Q(NamedTuple):
    q: torch.Tensor
    scale: torch.Tensor


class _QW(NamedTuple):
    q: torch.Tensor
    scale_inv: torch.Tensor


def _define_ref_ops():
    """epkit's four expert-compute kernels as torch custom ops (epkit_ref::*) over the float64
    references, in the same out-argument form as epkit's own ops: the CPU tests trace
    epkit.transformers' forward with torch.compile(fullgraph=True) through them. Rows that no group
    owns are filled with NaN, so a forward that reads them shows it."""
    op = torch.library.custom_op

    @op("epkit_ref::quantize", mutates_args=("q", "scale"))
    def quantize(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
        rq, rs = R.quantize(x)
        q.copy_(rq)
        scale.copy_(rs)

    @quantize.register_fake
    def _(x, q, scale):
        return None

    @op("epkit_ref::grouped_gemm", mutates_args=("d",))
    def grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                     d: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor) -> None:
        d.view(torch.int16).fill_(-1)  # bf16 NaN
        for g, (o, c) in enumerate(zip(offsets.tolist(), counts.tolist())):
            if c > 0:
                d[o:o + c] = (R.dequant_rows(a[o:o + c], a_scale[o:o + c])
                              @ R.dequant_weight(b[g], b_scale[g]).T).to(torch.bfloat16)

    @grouped_gemm.register_fake
    def _(a, a_scale, b, b_scale, d, counts, offsets):
        return None

    @op("epkit_ref::silu_mul_quantize", mutates_args=("q", "scale"))
    def silu_mul_quantize(h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, counts: torch.Tensor,
                          offsets: torch.Tensor) -> None:
        q.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
        scale.fill_(float("nan"))
        for o, c in zip(offsets.tolist(), counts.tolist()):
            if c > 0:
                rq, rs = R.silu_mul_quantize(h[o:o + c])
                q[o:o + c] = rq
                scale[o:o + c] = rs

    @silu_mul_quantize.register_fake
    def _(h, q, scale, counts, offsets):
        return None

    return torch.ops.epkit_ref


class RefBackend:
    """epkit.transformers' kernel backend (its _use_backend seam) made of the torch references:
    the same calls, shapes and dtypes as epkit.moe, on any device, recording each call's name."""

    requires_cuda = False
    _ops = None

    def __init__(self):
        if RefBackend._ops is None:
            RefBackend._ops = _define_ref_ops()
        self.calls = []
        self.gemm_rows = []  # rows each eager grouped_gemm call computed (the sum of its counts)

    def quantize(self, x):
        self.calls.append("quantize")
        T, H = x.shape
        out = _Q(torch.empty(T, H, dtype=FP8, device=x.device),
                 torch.empty(T, (H + 127) // 128, dtype=torch.float32, device=x.device))
        self._ops.quantize(x, out.q, out.scale)
        return out

    def quantize_weights(self, w, ue8m0=False):
        self.calls.append("quantize_weights")
        q, s = R.quantize_weights(w, ue8m0)
        return _QW(q, s)

    def grouped_gemm(self, a, a_scale, b, b_scale, counts, offsets, out=None, *, expected_m=0):
        self.calls.append("grouped_gemm")
        assert expected_m >= 1
        if not torch.compiler.is_compiling():
            self.gemm_rows.append(int(counts.sum()))
        d = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device) if out is None else out
        self._ops.grouped_gemm(a, a_scale, b, b_scale, d, counts, offsets)
        return d

    def silu_mul_quantize(self, h, counts, offsets):
        self.calls.append("silu_mul_quantize")
        r, two_i = h.shape
        out = _Q(torch.empty(r, two_i // 2, dtype=FP8, device=h.device),
                 torch.empty(r, two_i // 256, dtype=torch.float32, device=h.device))
        self._ops.silu_mul_quantize(h, out.q, out.scale, counts, offsets)
        return out


def env_seed() -> int:
    import random
    return int(os.environ.get("EPKIT_PY_SEED") or random.SystemRandom().randrange(1 << 30))
