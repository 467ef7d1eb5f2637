"""Torch reference for dispatch/combine and the checks the GPU tests apply.

Token identity is (DP group, token index). Every rank builds every group's inputs from the same seed,
so each rank can compute what it must receive and what combine must return without communication.
The experts are y_e(x) = (dequant(x) * coef[e]) rounded to the combine-in dtype, computed the same
way on the expert side and in the reference, so only combine's accumulation and output rounding are
compared with a tolerance; dispatch is a copy and is compared bit for bit.
"""

from dataclasses import dataclass

import torch

SCALE_BLOCK = 128
FP8 = torch.float8_e4m3fn


@dataclass
class Problem:
    world_size: int
    dp_size: int
    num_experts: int
    topk: int
    hidden: int
    max_tokens: int
    payload: torch.dtype
    combine_in: torch.dtype
    combine_out: torch.dtype

    @property
    def num_local_experts(self):
        return self.num_experts // self.world_size

    @property
    def num_groups(self):
        return self.world_size // self.dp_size

    @property
    def capacity(self):
        return self.max_tokens * self.num_groups

    @property
    def num_scales(self):
        return (self.hidden + SCALE_BLOCK - 1) // SCALE_BLOCK if self.payload == FP8 else 0

    @property
    def hidden_dim_bytes(self):
        return self.hidden * torch.empty((), dtype=self.payload).element_size()

    @property
    def hidden_dim_scale_bytes(self):
        return self.num_scales * 4


@dataclass
class GroupInputs:
    m: int
    x: torch.Tensor            # [m, H] payload dtype
    x_scale: torch.Tensor      # [m, S] fp32 or None
    idx: torch.Tensor          # [m, K] int64, distinct experts per token
    weights: torch.Tensor      # [m, K] fp32

    def to(self, device):
        return GroupInputs(self.m, self.x.to(device), None if self.x_scale is None else self.x_scale.to(device),
                           self.idx.to(device), self.weights.to(device))


def group_inputs(p: Problem, group: int, seed: int, m: int = None) -> GroupInputs:
    g = torch.Generator().manual_seed(seed * 7919 + group)
    if m is None:
        m = int(torch.randint(1, p.max_tokens + 1, (1,), generator=g))
    xf = torch.randn(m, p.hidden, generator=g) * 2
    x_scale = None
    if p.payload == FP8:
        x = xf.to(FP8)
        x_scale = torch.rand(m, p.num_scales, generator=g) + 0.5
    else:
        x = xf.to(p.payload)
    idx = torch.rand(m, p.num_experts, generator=g).topk(p.topk, dim=1).indices
    weights = torch.rand(m, p.topk, generator=g)
    return GroupInputs(m, x, x_scale, idx, weights)


def all_groups(p: Problem, seed: int, device, m=None):
    return [group_inputs(p, g, seed, m).to(device) for g in range(p.num_groups)]


def dequant(x, x_scale, hidden):
    xf = x.float()
    if x_scale is None:
        return xf
    return xf * x_scale.repeat_interleave(SCALE_BLOCK, dim=-1)[..., :hidden]


def coefficients(p: Problem, device):
    return 0.5 + torch.arange(p.num_experts, device=device, dtype=torch.float32) / p.num_experts


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def _sort_by_content(bits):
    key_vec = torch.linspace(1.0, 2.0, bits.shape[1], dtype=torch.float64, device=bits.device).sin()
    return torch.argsort(bits.double() @ key_vec)


def check_dispatch(p: Problem, rank: int, groups, expert_num_tokens, expert_x, expert_x_scale, tag):
    """Counts exactly; each local expert's rows (and scales) bit-exact against the tokens routed to it."""
    L = p.num_local_experts
    counts = expert_num_tokens.cpu().tolist()
    for l in range(L):
        e = rank * L + l
        rows, scales = [], []
        for gi in groups:
            hit = (gi.idx == e).any(dim=1)
            rows.append(gi.x[hit])
            if gi.x_scale is not None:
                scales.append(gi.x_scale[hit])
        exp_x = torch.cat(rows)
        n = exp_x.shape[0]
        assert counts[l] == n, f"{tag}: expert {e} received {counts[l]} tokens, expected {n}"
        if n == 0:
            continue
        got_bits, exp_bits = _bits(expert_x[l, :n]), _bits(exp_x)
        pg, pe = _sort_by_content(got_bits), _sort_by_content(exp_bits)
        assert torch.equal(got_bits[pg], exp_bits[pe]), f"{tag}: expert {e} payload rows differ from the tokens routed to it"
        if scales:
            assert torch.equal(expert_x_scale[l, :n][pg], torch.cat(scales)[pe]), f"{tag}: expert {e} scales differ"


def expert_forward(p: Problem, rank, expert_x, expert_x_scale, expert_num_tokens):
    """y[l, s] = dequant(x[l, s]) * coef[e] in combine-in dtype; slots past the count are NaN (poison
    that combine must never read). Only tensor ops, so it can sit inside a CUDA graph."""
    L = p.num_local_experts
    coef = coefficients(p, expert_x.device)[rank * L:(rank + 1) * L]
    y = (dequant(expert_x, expert_x_scale, p.hidden) * coef[:, None, None]).to(p.combine_in)
    valid = torch.arange(p.capacity, device=expert_x.device)[None, :] < expert_num_tokens[:, None]
    return torch.where(valid[..., None], y, torch.full_like(y, float("nan")))


def combine_reference(p: Problem, gi: GroupInputs):
    """(sum_k w * y, sum_k |w * y|) in fp32 for one group's tokens."""
    coef = coefficients(p, gi.x.device)
    deq = dequant(gi.x, gi.x_scale, p.hidden)
    ref = torch.zeros(gi.m, p.hidden, device=gi.x.device)
    mag = torch.zeros_like(ref)
    for k in range(p.topk):
        y = (deq * coef[gi.idx[:, k]][:, None]).to(p.combine_in).float()
        wy = gi.weights[:, k:k + 1] * y
        ref += wy
        mag += wy.abs()
    return ref, mag


def check_combine(p: Problem, gi: GroupInputs, out, rtol, tag, untouched_from=None):
    """out[:m] within rtol of the reference, relative to sum_k |w * y| per element; rows from
    untouched_from on must still hold the NaN poison."""
    ref, mag = combine_reference(p, gi)
    got = out[:gi.m].float()
    assert not torch.isnan(got).any(), f"{tag}: combine left NaN in rows < m (read a poisoned slot or skipped a row)"
    err = (got - ref).abs()
    bound = rtol * mag + 1e-6
    bad = err > bound
    assert not bad.any(), (f"{tag}: combine off by up to {err.max().item():.3g} (rtol {rtol} of sum|w*y|) at "
                           f"{int(bad.sum())} of {bad.numel()} elements")
    if untouched_from is not None and out.shape[0] > untouched_from:
        assert torch.isnan(out[untouched_from:].float()).all(), f"{tag}: combine wrote rows >= m"
