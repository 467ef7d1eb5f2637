"""The GPU suite's oracle checked on the CPU: a simulated exchange that is correct by construction
(arrival order shuffled, as the kernels' is not deterministic) must pass the checks, and corrupted
ones must fail them. Needs torch only."""

import pytest

pytest.importorskip("torch", reason="epkit's Python tests need torch")

import torch  # noqa: E402

from _reference import FP8, Problem, all_groups, check_combine, check_dispatch, expert_forward  # noqa: E402

CPU = torch.device("cpu")


def _problem(payload, world_size=4, dp_size=2):
    cin = torch.bfloat16 if payload == FP8 else payload
    return Problem(world_size, dp_size, 4 * world_size, 3, 272, 12, payload, cin, cin)


def _simulate_dispatch(p, rank, groups, seed=0):
    L, C = p.num_local_experts, p.capacity
    expert_x = torch.zeros(L, C, p.hidden, dtype=p.payload)
    expert_x_scale = torch.full((L, C, p.num_scales), float("nan")) if p.num_scales else None
    counts = torch.zeros(L, dtype=torch.int32)
    slot_of = {}
    g = torch.Generator().manual_seed(seed)
    for l in range(L):
        e = rank * L + l
        arrivals = [(gi_n, t) for gi_n, gi in enumerate(groups) for t in range(gi.m) if (gi.idx[t] == e).any()]
        for s, j in enumerate(torch.randperm(len(arrivals), generator=g).tolist()):
            gn, t = arrivals[j]
            expert_x[l, s] = groups[gn].x[t]
            if expert_x_scale is not None:
                expert_x_scale[l, s] = groups[gn].x_scale[t]
            slot_of[(gn, t, e)] = (l, s)
        counts[l] = len(arrivals)
    return counts, expert_x, expert_x_scale, slot_of


def _simulate_combine(p, group, groups, ys_by_rank, slots_by_rank):
    gi = groups[group]
    out = torch.full((p.max_tokens, p.hidden), float("nan"), dtype=p.combine_out)
    L = p.num_local_experts
    for t in range(gi.m):
        acc = torch.zeros(p.hidden)
        for k in range(p.topk):
            e = int(gi.idx[t, k])
            r = e // L
            l, s = slots_by_rank[r][(group, t, e)]
            acc += gi.weights[t, k] * ys_by_rank[r][l, s].float()
        out[t] = acc.to(p.combine_out)
    return out


@pytest.mark.parametrize("payload", [torch.bfloat16, torch.float16, FP8])
def test_oracle_accepts_a_correct_exchange(payload):
    p = _problem(payload)
    groups = all_groups(p, seed=3, device=CPU)
    ys, slots = {}, {}
    for r in range(p.world_size):
        counts, ex, exs, slot_of = _simulate_dispatch(p, r, groups, seed=r)
        check_dispatch(p, r, groups, counts, ex, exs, f"rank {r}")
        ys[r], slots[r] = expert_forward(p, r, ex, exs, counts), slot_of
    for g in range(p.num_groups):
        out = _simulate_combine(p, g, groups, ys, slots)
        check_combine(p, groups[g], out, 1e-2 if payload != torch.float16 else 2e-3, f"group {g}",
                      untouched_from=groups[g].m)


def test_oracle_rejects_wrong_exchanges():
    p = _problem(FP8)
    groups = all_groups(p, seed=5, device=CPU)
    counts, ex, exs, slot_of = _simulate_dispatch(p, 1, groups)
    l = int(torch.argmax(counts))
    bad = ex.clone()
    bad[l, 0] = bad[l, 1]  # one token duplicated, another lost
    with pytest.raises(AssertionError, match="payload"):
        check_dispatch(p, 1, groups, counts, bad, exs, "dup")
    bad_s = exs.clone()
    bad_s[l, 0, -1] += 1  # the partial last scale block
    with pytest.raises(AssertionError, match="scales"):
        check_dispatch(p, 1, groups, counts, ex, bad_s, "scale")
    with pytest.raises(AssertionError, match="received"):
        check_dispatch(p, 1, groups, counts - 1, ex, exs, "count")

    ys, slots = {}, {}
    for r in range(p.world_size):
        c, e_x, e_s, so = _simulate_dispatch(p, r, groups, seed=r)
        ys[r], slots[r] = expert_forward(p, r, e_x, e_s, c), so
    out = _simulate_combine(p, 0, groups, ys, slots)
    swapped = out.clone()
    swapped[[0, 1]] = out[[1, 0]]
    with pytest.raises(AssertionError, match="off by"):
        check_combine(p, groups[0], swapped, 1e-2, "swap")
    extra = out.clone()
    extra[groups[0].m:] = 0
    if groups[0].m < p.max_tokens:
        with pytest.raises(AssertionError, match="rows >= m"):
            check_combine(p, groups[0], extra, 1e-2, "extra", untouched_from=groups[0].m)
    # A poisoned (NaN) slot read by combine shows up as NaN in the output.
    y0 = ys[0].clone()
    y0[:, :] = float("nan")
    ys_bad = dict(ys)
    ys_bad[0] = y0
    with pytest.raises(AssertionError, match="NaN"):
        check_combine(p, groups[0], _simulate_combine(p, 0, groups, ys_bad, slots), 1e-2, "nan")
