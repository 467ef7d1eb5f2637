"""MoELayer test bodies that run on every rank (see _harness.run_ranks), and the torch composition
of epkit's own ops that the layer is compared with.

The model is synthetic, in the DeepSeek-V3 checkpoint layout: bf16 weights drawn on the CPU from
the test's seed (the same on every rank), quantized to e4m3 + 128x128 scale_inv by
epkit.quantize_weights. Each rank gives the layer its E / W local experts and composes the
reference from all E experts on its own tokens:

    xq, xs = quantize(x); per expert e: the tokens routed to e, gathered into a masked
    [E, cap, H] layout; h = grouped_gemm(w13); a = silu_mul_quantize(h); y = grouped_gemm(w2);
    out = bf16(bf16(sum_k w[t, k] * y(e, t)) + shared(x))

with the layer's own routing (checked exactly against epkit.route on the layer's logits and
against the torch router of _moe_reference), so the remaining differences are the GEMMs' fp32
accumulation order and the combine's summation order, whose effect include/epkit tests bound as
below (tests/layer/test_moe_layer.cu states the same tolerance, against the same kind of reference).
"""

import math
from typing import Dict, Optional

import dataclasses

import torch

import _moe_reference as R
import epkit

HIDDEN, INTER, SHARED_INTER = 512, 256, 384
TOPK, NUM_GROUPS, TOPK_GROUPS, SCALING = 4, 4, 2, 2.5
MAX_TOKENS = 24

# Tolerance of the layer output, relative to the norm of sum_k |w y| + |shared| (the magnitudes
# summed): the composition differs from the layer only in accumulation order (the GEMM configs the
# layer picks for its row counts, combine's fp32 sum against the float64 one here). That moves a
# bf16-rounded GEMM output by one bf16 step (2^-8) for the few elements near a rounding boundary,
# which can move one e4m3 code of the activation by one step or one block's scale; one such event
# changes a row by well under 1e-2 of its norm. So 1e-2 on the Frobenius norm, 3e-2 per row (a
# wrong expert, a lost token or a wrong weight gives errors of order 1), as the C++ layer test.
FROB_TOL, ROW_TOL = 1e-2, 3e-2


def num_experts(world_size):
    return 16 if world_size <= 2 else 4 * world_size


def config(world_size, rank, dp_size=1, schedule="none", **over):
    kw = dict(hidden=HIDDEN, intermediate=INTER, num_experts=num_experts(world_size), topk=TOPK,
              max_tokens_per_rank=MAX_TOKENS, router_mode="grouped_topk", num_groups=NUM_GROUPS,
              topk_groups=TOPK_GROUPS, routed_scaling=SCALING, num_shared_experts=1, shared_intermediate=SHARED_INTER,
              world_size=world_size, rank=rank, dp_size=dp_size, schedule=schedule)
    kw.update(over)
    return epkit.MoELayerConfig(**kw)


def router(cfg: "epkit.MoELayerConfig") -> R.Router:
    return R.Router(cfg.router_mode, cfg.num_experts, cfg.topk, cfg.num_groups, cfg.topk_groups, cfg.renormalize,
                    cfg.routed_scaling)


def make_model(seed: int, E: int, device) -> Dict[str, torch.Tensor]:
    """All E experts' weights (quantized on the device), the shared expert, gate and bias."""
    g = torch.Generator().manual_seed(seed)
    H, I, Is = HIDDEN, INTER, SHARED_INTER

    def randn(*shape, std):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16).to(device)

    md = {}
    for name, w in (("w13", randn(E, 2 * I, H, std=1 / math.sqrt(H))), ("w2", randn(E, H, I, std=1 / math.sqrt(I))),
                    ("shared_w13", randn(2 * Is, H, std=1 / math.sqrt(H))),
                    ("shared_w2", randn(H, Is, std=1 / math.sqrt(Is)))):
        q = epkit.quantize_weights(w)
        md[name], md[name + "_scale"] = q.q, q.scale_inv
    md["gate"] = randn(E, H, std=2 / math.sqrt(H))  # logits of order 2: a spread of sigmoid scores
    md["gate_bias"] = (torch.randn(E, generator=g) * 0.05).to(device)
    torch.cuda.synchronize()
    return md


def layer_weights(md, world_size, rank):
    """The layer's views: this rank's local experts, the shared expert, gate and bias."""
    L = md["w13"].shape[0] // world_size
    w = {k: v for k, v in md.items()}
    for k in ("w13", "w13_scale", "w2", "w2_scale"):
        w[k] = md[k][rank * L:(rank + 1) * L].contiguous()
    return w


def tokens(seed, rows, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, HIDDEN, generator=g).to(torch.bfloat16).to(device)


def poison_bf16(t):
    t.view(torch.int16).fill_(-1)  # 0xffff: a bf16 NaN
    return t


def compose(md, x, idx, w):
    """(out [m, H] fp32 of bf16 values, mag [m, H]) by epkit's ops and torch; see the module docstring."""
    m, H = x.shape
    dev = x.device
    E = md["w13"].shape[0]
    if m == 0:
        z = torch.zeros(0, H, dtype=torch.float32, device=dev)
        return z, z
    xq, xs = epkit.quantize(x)
    flat = idx.reshape(-1).long()
    token = torch.arange(m, device=dev).repeat_interleave(idx.shape[1])
    counts = torch.bincount(flat, minlength=E)
    cap = max(int(counts.max()), 1)
    order = torch.argsort(flat, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(flat)
    slot[order] = torch.arange(flat.numel(), device=dev) - starts[flat[order]]
    # Through uint8 views: torch implements few indexing kernels for float8 itself.
    ex = torch.zeros(E, cap, H, dtype=torch.uint8, device=dev)
    exs = torch.ones(E, cap, H // 128, dtype=torch.float32, device=dev)
    ex[flat, slot] = xq.view(torch.uint8)[token]
    exs[flat, slot] = xs[token]
    ex = ex.view(torch.float8_e4m3fn)
    cnt = counts.to(torch.int32)
    h = epkit.grouped_gemm(ex, exs, md["w13"], md["w13_scale"], cnt)
    a = epkit.silu_mul_quantize(h, cnt)
    y = epkit.grouped_gemm(a.q, a.scale, md["w2"], md["w2_scale"], cnt)
    terms = w.reshape(-1, 1).double() * y[flat, slot].double()  # [m * K, H]
    routed = terms.view(m, -1, H).sum(1).float().to(torch.bfloat16).float()
    mag = terms.abs().view(m, -1, H).sum(1)
    one = torch.tensor([m], dtype=torch.int32, device=dev)
    sh = epkit.grouped_gemm(xq[None], xs[None], md["shared_w13"][None], md["shared_w13_scale"][None], one)
    sa = epkit.silu_mul_quantize(sh, one)
    sy = epkit.grouped_gemm(sa.q, sa.scale, md["shared_w2"][None], md["shared_w2_scale"][None], one)[0].float()
    out = (routed + sy).to(torch.bfloat16).float()
    return out, (mag + sy.abs().double()).float()


def layer_routing(layer, m, rows, device_m):
    """The layer's (logits, topk_idx, topk_weights) of the last forward, tokens [0, m) in order.
    microbatch: half 0 holds the first ceil(n / 2) rows (n = m on the host, the rows of x with a
    device m) and half 1 the rest."""
    if layer.halves == 1:
        r = layer.routing(0)
        return r.logits[:m], r.topk_idx[:m], r.topk_weights[:m]
    sp = ((rows if device_m else m) + 1) // 2
    n0, n1 = min(m, sp), max(0, m - sp)
    r0, r1 = layer.routing(0), layer.routing(1)
    return tuple(torch.cat([a[:n0], b[:n1]]) for a, b in zip(r0, r1))


def check_forward(layer, md, x, out, m, device_m, tag):
    """One forward of m tokens: logits, routing (exact), output (tolerance), rows >= m untouched."""
    torch.cuda.synchronize()
    layer.check()
    cfg = layer.config
    rows = x.shape[0]
    logits, idx, w = (t.clone() for t in layer_routing(layer, m, rows, device_m))
    xs = x[:m]
    # 1. Logits: bf16 inputs are exact; fp32 accumulation over H terms.
    want = xs.double() @ md["gate"].double().T
    mag = xs.double().abs() @ md["gate"].double().abs().T
    bad = (logits.double() - want).abs() > 1e-5 * mag + 1e-6
    assert not bad.any(), f"{tag}: {int(bad.sum())} gate logits off (first at {bad.nonzero()[0].tolist()})"
    # 2. Routing: exact, by epkit.route on the layer's logits and by the torch reference router.
    rc = epkit.RouterConfig(mode=cfg.router_mode, num_experts=cfg.num_experts, topk=cfg.topk,
                            num_groups=cfg.num_groups, topk_groups=cfg.topk_groups, renormalize=cfg.renormalize,
                            routed_scaling=cfg.routed_scaling)
    again = epkit.route(logits, rc, bias=md["gate_bias"])
    ridx, rw = R.route(router(cfg), logits, md["gate_bias"])
    for name, (gi, gw) in (("epkit.route", again), ("torch reference", (ridx, rw))):
        assert torch.equal(idx, gi), f"{tag}: layer topk_idx differs from {name}"
        assert torch.equal(R.bits(w), R.bits(gw)), f"{tag}: layer topk_weights differ from {name} (bits)"
    # 3. Output against the composition.
    ref, refmag = compose(md, xs, idx, w)
    got = out[:m].float()
    assert torch.isfinite(got).all(), f"{tag}: non-finite output"
    err2 = ((got - ref).double() ** 2).sum(1)
    mag2 = (refmag.double() ** 2).sum(1)
    row_bad = err2.sqrt() > ROW_TOL * mag2.sqrt() + 1e-6
    assert not row_bad.any(), (f"{tag}: row {int(row_bad.nonzero()[0])} relative error "
                               f"{float((err2 / mag2.clamp_min(1e-30)).sqrt().max()):.3g} > {ROW_TOL}")
    if m:
        frob = float(err2.sum().sqrt() / mag2.sum().sqrt())
        assert frob <= FROB_TOL, f"{tag}: relative Frobenius error {frob:.3g} > {FROB_TOL}"
    # 4. Rows >= m keep their poison.
    assert bool((out[m:].view(torch.int16) == -1).all()), f"{tag}: rows >= m = {m} of out were written"


def _device():
    return torch.device("cuda", torch.cuda.current_device())


def _expect_error(fn, *needles):
    try:
        fn()
    except epkit.EpkitError as e:
        for n in needles:
            assert n in str(e), f"EpkitError {str(e)!r} does not mention {n!r}"
        return
    raise AssertionError(f"expected EpkitError mentioning {needles}")


def _run_stages(layer, x, out, m):
    out = layer.begin(x, out, num_tokens=m)
    if layer.halves == 1:
        for stage in (layer.stage_route, layer.stage_dispatch_send, layer.stage_experts, layer.stage_combine_recv):
            stage(0)
    else:  # the order forward() uses, with each half's chain in order
        for stage, h in ((layer.stage_route, 0), (layer.stage_dispatch_send, 0), (layer.stage_route, 1),
                         (layer.stage_dispatch_send, 1), (layer.stage_experts, 0), (layer.stage_experts, 1),
                         (layer.stage_combine_recv, 0), (layer.stage_combine_recv, 1)):
            stage(h)
    return out


def layer_forward_cases(rank, world_size, dp_size, seed, schedules=("none", "dispatch_overlap", "microbatch")):
    """Every schedule: host m in {0, 1, odd, M} (and m = the rows of x), the stage calls, and a device
    m above the rows (clamped and reported by check())."""
    dev = _device()
    E = num_experts(world_size)
    md = make_model(seed, E, dev)
    group = rank // dp_size
    for si, schedule in enumerate(schedules):
        cfg = config(world_size, rank, dp_size, schedule)
        layer = epkit.MoELayer(cfg, **layer_weights(md, world_size, rank))
        assert layer.num_local_experts == E // world_size
        for j, m in enumerate((0, 1, 7, MAX_TOKENS)):
            tag = f"W={world_size} dp={dp_size} rank={rank} {schedule} host m={m} seed={seed}"
            x = tokens(seed + 1000 * group + 10 * si + j, MAX_TOKENS, dev)
            out = poison_bf16(torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev))
            assert layer.forward(x, out, num_tokens=m) is out
            check_forward(layer, md, x, out, m, False, tag)
        # m = the rows of x; out allocated by forward.
        x = tokens(seed + 1000 * group + 10 * si + 7, 9, dev)
        out = layer(x)
        assert out.shape == (9, HIDDEN) and out.dtype == torch.bfloat16
        check_forward(layer, md, x, out, 9, False, f"W={world_size} rank={rank} {schedule} m=rows=9 seed={seed}")
        if schedule != "none":
            tag = f"W={world_size} dp={dp_size} rank={rank} {schedule} stage calls seed={seed}"
            x = tokens(seed + 1000 * group + 10 * si + 8, MAX_TOKENS, dev)
            out = poison_bf16(torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev))
            _run_stages(layer, x, out, 13)
            check_forward(layer, md, x, out, 13, False, tag)
        # A device m above the rows is clamped to them and reported; the layer stays usable.
        x = tokens(seed + 1000 * group + 10 * si + 9, MAX_TOKENS, dev)
        m_dev = torch.tensor([MAX_TOKENS + 3], dtype=torch.int32, device=dev)
        out = poison_bf16(torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev))
        layer.forward(x, out, num_tokens=m_dev)
        torch.cuda.synchronize()
        _expect_error(layer.check, "num_tokens")
        layer.check()  # re-armed
        layer.destroy()
        assert not layer.alive
        layer.destroy()  # idempotent


def layer_w1(rank, world_size, seed):
    layer_forward_cases(rank, world_size, 1, seed)
    layer_errors(rank, world_size, seed)


def layer_errors(rank, world_size, seed):
    """Bad weights, out-of-order stages and calls after destroy() raise EpkitError, launching nothing."""
    dev = _device()
    md = make_model(seed, num_experts(world_size), dev)
    w = layer_weights(md, world_size, rank)
    bad = dict(w, w2=w["w2"].view(torch.uint8)[:, :, :128].contiguous().view(torch.float8_e4m3fn))
    _expect_error(lambda: epkit.MoELayer(config(world_size, rank), **bad), "w2")
    _expect_error(lambda: epkit.MoELayer(config(world_size, rank, topk=0), **w), "topk")
    nobias = {k: v for k, v in w.items() if k != "gate_bias"}
    layer = epkit.MoELayer(config(world_size, rank, schedule="dispatch_overlap"), **nobias)
    x = tokens(seed, MAX_TOKENS, dev)
    layer.begin(x, num_tokens=5)
    _expect_error(lambda: layer.stage_experts(0), "out of order")
    _expect_error(lambda: layer.stage_route(1), "half")
    layer.stage_route(0)
    layer.stage_dispatch_send(0)
    layer.stage_experts(0)
    layer.stage_combine_recv(0)
    _expect_error(lambda: layer.forward(torch.empty(MAX_TOKENS + 1, HIDDEN, dtype=torch.bfloat16, device=dev)),
                  "max_tokens_per_rank")
    torch.cuda.synchronize()
    layer.check()
    layer.destroy()
    _expect_error(lambda: layer.forward(x), "destroyed")


def layer_graph_and_compile(rank, world_size, seed):
    """One CUDA graph per layer, captured with m on the device and replayed for m in {M, 5, 1, 0};
    then torch.compile(layer.forward, fullgraph=True) with host and device m."""
    dev = _device()
    E = num_experts(world_size)
    md = make_model(seed, E, dev)
    for si, schedule in enumerate(("none", "microbatch")):
        layer = epkit.MoELayer(config(world_size, rank, schedule=schedule), **layer_weights(md, world_size, rank))
        x = tokens(seed + 50 + si, MAX_TOKENS, dev)
        out = poison_bf16(torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev))
        m_dev = torch.tensor([MAX_TOKENS], dtype=torch.int32, device=dev)
        layer.forward(x, out, num_tokens=m_dev)  # warm-up: the gate's cuBLASLt heuristic at this bucket
        check_forward(layer, md, x, out, MAX_TOKENS, True, f"{schedule} eager device m seed={seed}")
        graph = torch.cuda.CUDAGraph()
        # thread_local, as tests/layer/test_moe_layer.cu captures the layer.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            layer.forward(x, out, num_tokens=m_dev)
        for it, m in enumerate((MAX_TOKENS, 5, 1, 0, 17)):
            x.copy_(tokens(seed + 60 + 10 * si + it, MAX_TOKENS, dev))
            poison_bf16(out)
            m_dev.fill_(m)
            graph.replay()
            check_forward(layer, md, x, out, m, True, f"{schedule} graph replay {it} m={m} seed={seed}")
        del graph
        layer.destroy()

    from torch import _dynamo
    try:
        from torch._inductor import config as inductor_config
        inductor_config.compile_threads = 1  # no worker pool per rank: the graph holds one op
    except (ImportError, AttributeError):
        pass
    _dynamo.reset()
    layer = epkit.MoELayer(config(world_size, rank), **layer_weights(md, world_size, rank))
    fwd = torch.compile(layer.forward, fullgraph=True)
    x = tokens(seed + 80, MAX_TOKENS, dev)
    out = poison_bf16(torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev))
    got = fwd(x, out, 11)
    check_forward(layer, md, x, got, 11, False, f"torch.compile host m=11 seed={seed}")
    m_dev = torch.tensor([6], dtype=torch.int32, device=dev)
    x = tokens(seed + 90, MAX_TOKENS, dev)
    out = poison_bf16(torch.empty(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=dev))
    got = fwd(x, out, m_dev)
    check_forward(layer, md, x, got, 6, True, f"torch.compile device m=6 seed={seed}")
    layer.destroy()


def errors_before_init(seed: Optional[int] = None):
    """Without nvshmem_init a MoELayer of several ranks cannot be made (its AllToAll objects need
    NVSHMEM); world size 1 can (layer_w1_without_nvshmem)."""
    md = make_model(seed or 1, 16, _device())
    _expect_error(lambda: epkit.MoELayer(config(2, 0), **layer_weights(md, 2, 0)), "nvshmem_init")


def layer_w1_without_nvshmem(rank, world_size, seed):
    """World size 1 in a process that never initialized NVSHMEM: every schedule and error case of
    layer_w1, and the layer's AllToAll needs no symmetric heap."""
    assert world_size == 1 and not epkit.nvshmem_initialized()
    layer_w1(rank, world_size, seed)
    cfg = dataclasses.replace(config(1, 0), world_size=None, rank=None)  # defaults: world size 1 without NVSHMEM
    layer = epkit.MoELayer(cfg, **layer_weights(make_model(seed, num_experts(1), _device()), 1, 0))
    assert layer.device == torch.device("cuda", torch.cuda.current_device())
    layer.destroy()
    assert not epkit.nvshmem_initialized()
