"""Test bodies of test_packed.py that run on every rank (see _harness.run_ranks): the expert-packed
dispatch layout through the idiomatic API. Each raises AssertionError with a tag naming the case."""

import torch

import epkit
from _reference import FP8, Problem, _bits, _sort_by_content, all_groups, check_combine, coefficients, dequant

HIDDEN = 1088          # the last fp8 scale block is partial
MAX_TOKENS = 24
TOP_K = 3


def config(world_size, dp_size, payload, align, **kw):
    d = {"bf16": "bf16", "fp8": "fp8_e4m3"}[payload]
    return epkit.AllToAllConfig(num_experts=4 * world_size, topk=TOP_K, hidden=HIDDEN,
                                max_tokens_per_rank=MAX_TOKENS, world_size=world_size, rank=0, dp_size=dp_size,
                                dispatch_dtype=d, layout="packed", packed_row_align=align, **kw)


def _expected_offsets(counts, align, rows):
    out, at = [], 0
    for n in counts:
        out.append(min(at, rows))
        at += (n + align - 1) // align * align
    out.append(min(at, rows))
    return out


def _check_packed_dispatch(p, rank, groups, d, align, rows, tag):
    """Counts exact, offsets by the formula, each expert's rows (and scales) bit-exact as a multiset."""
    L = p.num_local_experts
    counts = d.expert_num_tokens.cpu().tolist()
    offsets = d.expert_offsets.cpu().tolist()
    assert offsets == _expected_offsets(counts, align, rows), f"{tag}: offsets {offsets} for counts {counts}"
    for l in range(L):
        e = rank * L + l
        xs, scales = [], []
        for gi in groups:
            hit = (gi.idx == e).any(dim=1)
            xs.append(gi.x[hit])
            if gi.x_scale is not None:
                scales.append(gi.x_scale[hit])
        want = torch.cat(xs)
        n = want.shape[0]
        assert counts[l] == n, f"{tag}: expert {e} received {counts[l]} tokens, expected {n}"
        assert offsets[l] % align == 0, f"{tag}: expert {e} starts at row {offsets[l]}, not a multiple of {align}"
        if n == 0:
            continue
        got = d.expert_x[offsets[l]:offsets[l] + n]
        gb, wb = _bits(got), _bits(want)
        pg, pw = _sort_by_content(gb), _sort_by_content(wb)
        assert torch.equal(gb[pg], wb[pw]), f"{tag}: expert {e} rows differ from the tokens routed to it"
        if scales:
            assert torch.equal(d.expert_x_scale[offsets[l]:offsets[l] + n][pg], torch.cat(scales)[pw]), \
                f"{tag}: expert {e} scales differ"


def _packed_expert_forward(p, rank, d, rows):
    """y[r] = dequant(x[r]) * coef[expert of row r] in combine-in dtype; rows no expert holds are NaN
    (combine must never read them). Tensor ops only, so it can sit inside a CUDA graph."""
    L = p.num_local_experts
    dev = d.expert_x.device
    coef = coefficients(p, dev)[rank * L:(rank + 1) * L]
    r = torch.arange(rows, device=dev, dtype=torch.int64)
    starts = d.expert_offsets[:L].long()
    el = (torch.searchsorted(starts, r, right=True) - 1).clamp(min=0)
    valid = r < starts[el] + d.expert_num_tokens[el]
    y = (dequant(d.expert_x, d.expert_x_scale, p.hidden) * coef[el][:, None]).to(p.combine_in)
    return torch.where(valid[:, None], y, torch.full_like(y, float("nan")))


def _padded(gi, p, rows):
    """Inputs padded to `rows` rows routed to real experts, so a kernel reading past m is caught."""
    dev = gi.x.device
    pad = rows - gi.m
    g = torch.Generator(device="cpu").manual_seed(4321 + gi.m)
    pad_idx = torch.rand(pad, p.num_experts, generator=g).topk(p.topk, dim=1).indices.to(dev)
    x = torch.cat([gi.x, torch.full((pad, p.hidden), 3.0, device=dev).to(p.payload)])
    scale = None if gi.x_scale is None else torch.cat([gi.x_scale, torch.full((pad, p.num_scales), 9.0, device=dev)])
    return x, scale, torch.cat([gi.idx, pad_idx]), torch.cat([gi.weights, torch.full((pad, TOP_K), 5.0, device=dev)])


def _poison(ata):
    d = ata.empty_dispatch_output()
    d.expert_x.view(torch.uint8).fill_(0x7F)
    if d.expert_x_scale is not None:
        d.expert_x_scale.fill_(float("nan"))
    d.expert_num_tokens.fill_(-7)
    d.expert_offsets.fill_(-7)
    return d


def packed_rounds(rank, world_size, dp_size, payloads, aligns):
    dev = torch.device("cuda", torch.cuda.current_device())
    for name in payloads:
        payload = FP8 if name == "fp8" else torch.bfloat16
        p = Problem(world_size, dp_size, 4 * world_size, TOP_K, HIDDEN, MAX_TOKENS, payload, torch.bfloat16,
                    torch.bfloat16)
        for align in aligns:
            cfg = config(world_size, dp_size, name, align)
            cfg.world_size = cfg.rank = None  # the PE's own
            with epkit.AllToAll(cfg) as ata:
                R = ata.packed_rows
                assert ata.packed and ata.expert_shape() == (R, HIDDEN)
                for it, variant in enumerate(["fused", "split", "fused_device_m", "split_device_m"]):
                    tag = f"packed W={world_size} dp={dp_size} {name} align={align} {variant} rank={rank}"
                    groups = all_groups(p, 300 + 10 * it + align, dev)
                    mine = groups[rank // dp_size]
                    out_d = _poison(ata)
                    if variant.endswith("device_m"):
                        x, xs, idx, w = _padded(mine, p, MAX_TOKENS)
                        m = torch.tensor([mine.m], dtype=torch.int32, device=dev)
                    else:
                        x, xs, idx, w, m = mine.x, mine.x_scale, mine.idx, mine.weights, mine.m
                    if variant.startswith("split"):
                        d = ata.dispatch_recv(ata.dispatch_send(x, idx, xs, num_tokens=m, out=out_d))
                    else:
                        d = ata.dispatch(x, idx, xs, num_tokens=m, out=out_d)
                    torch.cuda.synchronize()
                    _check_packed_dispatch(p, rank, groups, d, align, R, tag)
                    y = _packed_expert_forward(p, rank, d, R)
                    out = torch.full((MAX_TOKENS, HIDDEN), float("nan"), dtype=torch.bfloat16, device=dev)
                    if variant.startswith("split"):
                        ata.combine_recv(ata.combine_send(y, idx, w, num_tokens=m, out=out))
                    else:
                        ata.combine(y, idx, w, num_tokens=m, out=out)
                    torch.cuda.synchronize()
                    ata.check()
                    check_combine(p, mine, out, 1e-2, tag, untouched_from=mine.m)


def packed_graph(rank, world_size, dp_size):
    """dispatch -> packed experts -> combine captured once with m on the device, replayed for new m."""
    dev = torch.device("cuda", torch.cuda.current_device())
    p = Problem(world_size, dp_size, 4 * world_size, TOP_K, HIDDEN, MAX_TOKENS, FP8, torch.bfloat16, torch.bfloat16)
    cfg = config(world_size, dp_size, "fp8", 8)
    cfg.world_size = cfg.rank = None
    with epkit.AllToAll(cfg) as ata:
        R = ata.packed_rows
        x = torch.zeros(MAX_TOKENS, HIDDEN, device=dev).to(FP8)
        xs = torch.ones(MAX_TOKENS, p.num_scales, device=dev)
        idx = torch.zeros(MAX_TOKENS, TOP_K, dtype=torch.int64, device=dev)
        w = torch.zeros(MAX_TOKENS, TOP_K, device=dev)
        m = torch.zeros(1, dtype=torch.int32, device=dev)
        d = _poison(ata)
        y = torch.empty(R, HIDDEN, dtype=torch.bfloat16, device=dev)
        out = torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev)
        # Warm-up outside the graph (first use of torch's kernels), then capture.
        ata.dispatch(x, idx, xs, num_tokens=m, out=d)
        ata.combine(y.zero_(), idx, w, num_tokens=m, out=out)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ata.dispatch(x, idx, xs, num_tokens=m, out=d)
            y.copy_(_packed_expert_forward(p, rank, d, R))
            ata.combine(y, idx, w, num_tokens=m, out=out)
        for it, mm in enumerate([MAX_TOKENS, 5, 0, 17]):
            tag = f"packed graph W={world_size} dp={dp_size} replay#{it} m={mm} rank={rank}"
            groups = all_groups(p, 700 + it, dev, m=mm)
            mine = groups[rank // dp_size]
            px, pxs, pidx, pw = _padded(mine, p, MAX_TOKENS)
            x.copy_(px)
            xs.copy_(pxs)
            idx.copy_(pidx)
            w.copy_(pw)
            m.fill_(mine.m)
            for dst, src in zip(d, _poison(ata)):
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ata.check()
            _check_packed_dispatch(p, rank, groups, d, 8, R, tag)
            check_combine(p, mine, out, 1e-2, tag, untouched_from=mine.m)
        del graph
