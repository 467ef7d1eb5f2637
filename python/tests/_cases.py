"""Test bodies that run on every rank (see _harness.run_ranks). Each raises AssertionError with a
tag naming world size, dp size, payload, variant and rank."""

import gc

import torch

import epkit
from _reference import FP8, Problem, all_groups, check_combine, check_dispatch, expert_forward

BF16, FP16 = torch.bfloat16, torch.float16
# payload -> (combine in, combine out, rtol of combine against the fp32 reference)
PAYLOADS = {
    "bf16": (BF16, BF16, BF16, 1e-2),
    "fp16": (FP16, FP16, FP16, 2e-3),
    "fp8": (FP8, BF16, BF16, 1e-2),
}
# Combine is compared to an fp32 reference; its error is the rounding of the partials and of the
# sum to the OUTPUT type (half an ulp each: 2^-8 for bf16, 2^-11 for fp16), whatever expert_y is.
RTOL_OUT = {BF16: 1e-2, FP16: 2e-3}
HIDDEN = 1088          # a multiple of 16 that is not one of 128: the last fp8 scale block is partial
MAX_TOKENS = 24
TOP_K = 3

# Every dtype set pplx-kernels accepts, per AllToAll element size: (payload, expert_y, out_tokens).
# A 2-byte AllToAll takes bf16 and fp16 payloads, an fp8 one fp8 (+ scales); combine takes expert_y
# and out_tokens in bf16 or fp16, each independently.
COMBOS = {
    "16-bit": [(d, cin, cout) for d in (BF16, FP16) for cin in (BF16, FP16) for cout in (BF16, FP16)],
    "fp8": [(FP8, cin, cout) for cin in (BF16, FP16) for cout in (BF16, FP16)],
}


def problem(world_size, dp_size, payload):
    d, cin, cout, _ = PAYLOADS[payload]
    return Problem(world_size, dp_size, num_experts=4 * world_size, topk=TOP_K, hidden=HIDDEN,
                   max_tokens=MAX_TOKENS, payload=d, combine_in=cin, combine_out=cout)


def combo_problem(world_size, dp_size, payload, cin, cout):
    return Problem(world_size, dp_size, num_experts=4 * world_size, topk=TOP_K, hidden=HIDDEN,
                   max_tokens=MAX_TOKENS, payload=payload, combine_in=cin, combine_out=cout)


def pplx_all_to_all(p: Problem, rank):
    """An AllToAll created the pplx way: only hidden_dim_bytes says the element size."""
    return epkit.pplx.AllToAll.internode(p.max_tokens, p.num_experts, p.topk, rank, p.world_size, p.dp_size,
                                    p.hidden, p.hidden_dim_bytes, p.hidden_dim_scale_bytes)


def dname(t):
    return {BF16: "bf16", FP16: "fp16", FP8: "fp8"}[t]


def as_u32(t):
    """uint32 indices as pplx takes them; built through int32 because torch implements few kernels
    (casts, fills) for uint32 itself."""
    return t.to(torch.int32).view(torch.uint32)


def _device():
    return torch.device("cuda", torch.cuda.current_device())


def _poisoned_dispatch_outputs(p: Problem):
    dev = _device()
    L, C = p.num_local_experts, p.capacity
    # 0x7f bytes: NaN in fp8 e4m3fn and fp16, ~3e38 in bf16; never a copy of the random inputs.
    expert_x = torch.full((L, C, p.hidden * torch.empty((), dtype=p.payload).element_size()), 0x7F,
                          dtype=torch.uint8, device=dev).view(p.payload)
    expert_x_scale = None
    if p.num_scales:
        expert_x_scale = torch.full((L, C, p.num_scales), float("nan"), device=dev)
    expert_num_tokens = torch.full((L,), -7, dtype=torch.int32, device=dev)
    return expert_num_tokens, expert_x, expert_x_scale


def _padded(gi, p: Problem, rows):
    """The group's inputs padded to `rows` rows; padding rows route to real experts so a kernel reading
    past m would be caught."""
    dev = gi.x.device
    pad = rows - gi.m
    g = torch.Generator(device="cpu").manual_seed(12345 + gi.m)
    pad_idx = torch.rand(pad, p.num_experts, generator=g).topk(p.topk, dim=1).indices.to(dev)
    x = torch.cat([gi.x, torch.full((pad, p.hidden), 3.0, device=dev).to(p.payload)])
    scale = None if gi.x_scale is None else torch.cat([gi.x_scale, torch.full((pad, p.num_scales), 9.0, device=dev)])
    idx = as_u32(torch.cat([gi.idx, pad_idx]))
    w = torch.cat([gi.weights, torch.full((pad, p.topk), 5.0, device=dev)])
    return x, scale, idx, w


def compat_round(ata, p: Problem, rank, seed, variant, rtol, tag):
    """One dispatch + expert + combine through the pplx-compatible API; checks both."""
    dev = _device()
    groups = all_groups(p, seed, dev)
    mine = groups[rank // p.dp_size]
    split = variant.startswith("split")
    if variant.endswith("device_m"):
        x, x_scale, idx, w = _padded(mine, p, p.max_tokens)
        bound_m = torch.tensor([mine.m], dtype=torch.int32, device=dev).view(torch.uint32)
    else:
        x, x_scale, idx, w = mine.x, mine.x_scale, as_u32(mine.idx), mine.weights
        bound_m = None
    num_tokens, expert_x, expert_x_scale = _poisoned_dispatch_outputs(p)
    kw = dict(out_expert_num_tokens=num_tokens, out_expert_x=expert_x, out_expert_x_scale=expert_x_scale,
              dp_x=x, dp_x_scale=x_scale, indices=idx, bound_m=bound_m)
    if split:
        ata.dispatch(**kw, do_send=True, do_recv=False)
        torch.randn(256, 256, device=dev).sum()  # other work between the halves
        ata.dispatch(**kw, do_send=False, do_recv=True)
    else:
        ata.dispatch(**kw)
    torch.cuda.synchronize()
    if getattr(ata, "impl", None) is not None:
        ata.impl.check()
    check_dispatch(p, rank, groups, num_tokens, expert_x, expert_x_scale, tag)

    expert_y = expert_forward(p, rank, expert_x, expert_x_scale, num_tokens)
    out = torch.full((p.max_tokens, p.hidden), float("nan"), dtype=p.combine_out, device=dev)
    kw = dict(out_tokens=out, indices=idx, weights=w, expert_y=expert_y, bound_m=bound_m)
    if split:
        ata.combine(**kw, do_send=True, do_recv=False)
        ata.combine(**kw, do_send=False, do_recv=True)
    else:
        ata.combine(**kw)
    torch.cuda.synchronize()
    if getattr(ata, "impl", None) is not None:
        ata.impl.check()  # a kernel-recorded error (timeout, overflow, bad index) says more than a mismatch
    check_combine(p, mine, out, rtol, tag, untouched_from=mine.m)


VARIANTS = ["fused_host_m", "split_device_m", "fused_device_m", "split_host_m"]


def compat_correctness(rank, world_size, dp_size, sizes=("16-bit", "fp8")):
    """One pplx-style AllToAll per element size serves every dtype set pplx accepts, one layer each,
    the call variants (fused/split, host/device m) rotating over them on the same buffers."""
    for size in sizes:
        combos = COMBOS[size]
        ata = pplx_all_to_all(combo_problem(world_size, dp_size, *combos[0]), rank)
        for it, (d, cin, cout) in enumerate(combos):
            p = combo_problem(world_size, dp_size, d, cin, cout)
            variant = VARIANTS[it % len(VARIANTS)]
            tag = (f"W={world_size} dp={dp_size} {size} AllToAll, dp_x {dname(d)} expert_y {dname(cin)} "
                   f"out_tokens {dname(cout)} {variant}#{it} rank={rank}")
            compat_round(ata, p, rank, seed=100 * it + 10 * dp_size + world_size, variant=variant,
                         rtol=RTOL_OUT[cout], tag=tag)
        ata.destroy()


def idiomatic(rank, world_size):
    """AllToAll with config keyword names: fp16 payload, fp32 expert outputs, bf16 output,
    int64 indices, returned outputs and split halves."""
    dev = _device()
    p = Problem(world_size, 1, 4 * world_size, TOP_K, HIDDEN, MAX_TOKENS, torch.float16, torch.float32, torch.bfloat16)
    cfg = epkit.AllToAllConfig(num_experts=p.num_experts, topk=TOP_K, hidden=HIDDEN,
                               max_tokens_per_rank=MAX_TOKENS, dp_size=1, dispatch_dtype="fp16",
                               combine_in_dtype=torch.float32, combine_out_dtype="bf16")
    cfg.validate()
    with epkit.AllToAll(cfg) as ata:
        assert ata.num_local_experts == p.num_local_experts and ata.capacity == p.capacity
        assert ata.symmetric_bytes > 0
        for it in range(2):
            tag = f"idiomatic#{it} rank={rank}"
            groups = all_groups(p, 500 + it, dev)
            mine = groups[rank]
            if it == 0:
                num_tokens, expert_x, expert_x_scale = _poisoned_dispatch_outputs(p)
                d = ata.dispatch(mine.x, mine.idx, out=epkit.DispatchOutput(expert_x, expert_x_scale, num_tokens))
            else:
                d = ata.dispatch_recv(ata.dispatch_send(mine.x, mine.idx, num_tokens=mine.m))
            torch.cuda.synchronize()
            check_dispatch(p, rank, groups, d.expert_num_tokens, d.expert_x, d.expert_x_scale, tag)
            y = expert_forward(p, rank, d.expert_x, d.expert_x_scale, d.expert_num_tokens)
            if it == 0:
                out = ata.combine(y, mine.idx, mine.weights)
            else:
                out = ata.combine_recv(ata.combine_send(y, mine.idx, mine.weights, num_tokens=mine.m))
            torch.cuda.synchronize()
            ata.check()
            assert out.shape == (mine.m, HIDDEN) and out.dtype == torch.bfloat16
            check_combine(p, mine, out, 1e-2, tag)
    assert not ata.alive


def weights_at_dispatch(rank, world_size, dp_size):
    """weights_at_dispatch=True: the router weights go to dispatch (fused and split), combine takes
    none; weights on the wrong call raise EpkitError and launch nothing."""
    dev = _device()
    p = problem(world_size, dp_size, "fp8")
    cfg = epkit.AllToAllConfig(num_experts=p.num_experts, topk=TOP_K, hidden=HIDDEN,
                               max_tokens_per_rank=MAX_TOKENS, dp_size=dp_size, dispatch_dtype="fp8_e4m3",
                               weights_at_dispatch=True)
    with epkit.AllToAll(cfg) as ata:
        for it in range(3):
            tag = f"weights_at_dispatch#{it} W={world_size} dp={dp_size} rank={rank}"
            groups = all_groups(p, 900 + it, dev)
            mine = groups[rank // dp_size]
            num_tokens, expert_x, expert_x_scale = _poisoned_dispatch_outputs(p)
            out_d = epkit.DispatchOutput(expert_x, expert_x_scale, num_tokens)
            if it == 0:
                _expect_error(lambda: ata.dispatch(mine.x, mine.idx, mine.x_scale, out=out_d), "topk_weights")
            if it % 2 == 0:
                d = ata.dispatch(mine.x, mine.idx, mine.x_scale, topk_weights=mine.weights, out=out_d)
            else:
                d = ata.dispatch_recv(ata.dispatch_send(mine.x, mine.idx, mine.x_scale, num_tokens=mine.m,
                                                        topk_weights=mine.weights, out=out_d))
            torch.cuda.synchronize()
            check_dispatch(p, rank, groups, d.expert_num_tokens, d.expert_x, d.expert_x_scale, tag)
            y = expert_forward(p, rank, d.expert_x, d.expert_x_scale, d.expert_num_tokens)
            if it == 0:
                _expect_error(lambda: ata.combine(y, mine.idx, mine.weights), "topk_weights", "weights_at_dispatch")
            out = torch.full((MAX_TOKENS, HIDDEN), float("nan"), dtype=torch.bfloat16, device=dev)
            if it % 2 == 0:
                ata.combine(y, mine.idx, num_tokens=mine.m, out=out)
            else:
                ata.combine_recv(ata.combine_send(y, mine.idx, num_tokens=mine.m, out=out))
            torch.cuda.synchronize()
            ata.check()
            check_combine(p, mine, out, PAYLOADS["fp8"][3], tag, untouched_from=mine.m)


# Dtype sets the graph test captures as the FIRST calls of a fresh AllToAll: none of them is the
# type of the object's config (bf16 / bf16 / bf16), so nothing may depend on having seen it before.
GRAPH_COMBOS = [(FP16, BF16, FP16), (FP8, FP16, BF16)]


def cuda_graph(rank, world_size, dp_size, combos=GRAPH_COMBOS):
    """Captures dispatch -> experts -> combine in one torch.cuda.CUDAGraph with bound_m on the device,
    as the very first calls of the AllToAll and with a dtype set it never saw, then replays it for
    fresh inputs with different m; an eager layer with other dtypes follows on the same object."""
    dev = _device()
    for d, cin, cout in combos:
        p = combo_problem(world_size, dp_size, d, cin, cout)
        rtol = RTOL_OUT[cout]
        name = f"dp_x {dname(d)} expert_y {dname(cin)} out_tokens {dname(cout)}"
        ata = pplx_all_to_all(p, rank)

        x = torch.zeros(p.max_tokens, p.hidden, device=dev).to(p.payload)
        x_scale = torch.ones(p.max_tokens, p.num_scales, device=dev) if p.num_scales else None
        idx = as_u32(torch.zeros(p.max_tokens, p.topk, dtype=torch.int32, device=dev))
        w = torch.zeros(p.max_tokens, p.topk, device=dev)
        bound_m = torch.zeros(1, dtype=torch.int32, device=dev).view(torch.uint32)
        num_tokens, expert_x, expert_x_scale = _poisoned_dispatch_outputs(p)
        expert_y = torch.empty(p.num_local_experts, p.capacity, p.hidden, dtype=p.combine_in, device=dev)
        out = torch.empty(p.max_tokens, p.hidden, dtype=p.combine_out, device=dev)

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ata.dispatch(num_tokens, expert_x, expert_x_scale, x, x_scale, idx, bound_m)
            expert_y.copy_(expert_forward(p, rank, expert_x, expert_x_scale, num_tokens))
            ata.combine(out, idx, w, expert_y, bound_m)

        for it in range(3):
            tag = f"graph W={world_size} dp={dp_size} {name} replay#{it} rank={rank}"
            groups = all_groups(p, 900 + it, dev, m=[p.max_tokens, 5, 17][it])
            mine = groups[rank // dp_size]
            px, pscale, pidx, pw = _padded(mine, p, p.max_tokens)
            x.copy_(px)
            idx.copy_(pidx)
            w.copy_(pw)
            if x_scale is not None:
                x_scale.copy_(pscale)
            bound_m.view(torch.int32).fill_(mine.m)
            poison = _poisoned_dispatch_outputs(p)
            for dst, src in zip((num_tokens, expert_x, expert_x_scale), poison):
                if dst is not None:
                    dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ata.impl.check()
            check_dispatch(p, rank, groups, num_tokens, expert_x, expert_x_scale, tag)
            check_combine(p, mine, out, rtol, tag, untouched_from=mine.m)
        del graph
        # Eager, on the same object, with the other expert_y and out_tokens types.
        other = {BF16: FP16, FP16: BF16}
        q = combo_problem(world_size, dp_size, d, other[cin], other[cout])
        compat_round(ata, q, rank, seed=31, variant="split_device_m", rtol=RTOL_OUT[q.combine_out],
                     tag=f"eager after graph {name} rank={rank}")
        ata.destroy()


def _expect_error(fn, *needles):
    try:
        fn()
    except epkit.EpkitError as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"EpkitError message {msg!r} does not mention {n!r}"
        return
    raise AssertionError(f"expected EpkitError mentioning {needles}")


def errors(rank, world_size):
    """Bad calls raise EpkitError with the C++ message, launch nothing, and leave the object usable."""
    dev = _device()
    _expect_error(lambda: epkit.nvshmem_init(epkit.nvshmem_alloc_empty_unique_id(), rank, world_size), "already initialized")
    _expect_error(lambda: epkit.pplx.AllToAll.internode(MAX_TOKENS, 4 * world_size, TOP_K, rank, world_size, 1,
                                                   HIDDEN, 3 * HIDDEN, 0), "hidden_dim_bytes")
    p = problem(world_size, 1, "bf16")
    ata = epkit.pplx.AllToAll.internode(p.max_tokens, p.num_experts, p.topk, rank, world_size, 1,
                                   p.hidden, p.hidden_dim_bytes, 0)
    compat_round(ata, p, rank, seed=1, variant="fused_host_m", rtol=1e-2, tag=f"errors before rank={rank}")

    gi = all_groups(p, 2, dev)[rank]
    idx = as_u32(gi.idx)
    num_tokens, expert_x, _ = _poisoned_dispatch_outputs(p)

    def dispatch(**over):
        kw = dict(out_expert_num_tokens=num_tokens, out_expert_x=expert_x, out_expert_x_scale=None, dp_x=gi.x,
                  dp_x_scale=None, indices=idx, bound_m=None)
        kw.update(over)
        ata.dispatch(**kw)

    _expect_error(lambda: dispatch(out_expert_x=expert_x.float()), "out_expert_x (expert_x) has dtype fp32, expected bf16 or fp16")
    # dtypes are the call's, within the element size the AllToAll was created for.
    _expect_error(lambda: dispatch(dp_x=gi.x.to(FP8)), "dp_x (x) has dtype fp8_e4m3, expected bf16 or fp16")
    _expect_error(lambda: dispatch(dp_x=gi.x.to(FP16)), "out_expert_x (expert_x) is bf16 but dp_x (x) is fp16")
    wide = torch.zeros(gi.m, 2 * p.hidden, dtype=p.payload, device=dev)
    _expect_error(lambda: dispatch(dp_x=wide[:, :p.hidden]), "dp_x", "contiguous")
    _expect_error(lambda: dispatch(indices=idx.cpu()), "indices (topk_idx)", "CUDA")
    _expect_error(lambda: dispatch(bound_m=torch.zeros(2, dtype=torch.int32, device=dev).view(torch.uint32)),
                  "bound_m (num_tokens_device)")
    _expect_error(lambda: dispatch(do_send=False, do_recv=False), "do_send")
    # A layer with bad combine calls in it: each is refused before it launches, and the layer then
    # completes correctly. fp32 expert_y needs combine_in_dtype=fp32 at creation; a receive half
    # must have the out_tokens dtype its send half packed the partials in.
    q = combo_problem(world_size, 1, BF16, FP16, FP16)
    groups = all_groups(q, 4, dev)
    mine = groups[rank]
    num_tokens, expert_x, _ = _poisoned_dispatch_outputs(q)
    ata.dispatch(num_tokens, expert_x, None, mine.x, None, as_u32(mine.idx), None)
    y16 = expert_forward(q, rank, expert_x, None, num_tokens)
    out16 = torch.full((q.max_tokens, q.hidden), float("nan"), dtype=FP16, device=dev)
    kw = dict(indices=as_u32(mine.idx), weights=mine.weights, bound_m=None)
    _expect_error(lambda: ata.combine(out16, **kw, expert_y=y16.float()), "combine_in_dtype")
    kw["expert_y"] = y16
    ata.combine(out16, **kw, do_send=True, do_recv=False)
    _expect_error(lambda: ata.combine(out16.to(BF16), **kw, do_send=False, do_recv=True),
                  "out_tokens (out) is bf16 but combine_send packed this layer's partials as fp16")
    ata.combine(out16, **kw, do_send=False, do_recv=True)
    torch.cuda.synchronize()
    check_combine(q, mine, out16, RTOL_OUT[FP16], f"errors split out dtype rank={rank}", untouched_from=mine.m)

    # Still correct after the rejected calls (none of them launched anything).
    compat_round(ata, p, rank, seed=3, variant="fused_host_m", rtol=1e-2, tag=f"errors after rank={rank}")
    ata.destroy()
    ata.destroy()  # idempotent
    _expect_error(lambda: dispatch(), "destroyed")


def _gpus_of_all_ranks(dev):
    """Each rank's GPU (its UUID), gathered over the harness's torch.distributed group."""
    import torch.distributed as dist
    props = torch.cuda.get_device_properties(dev)
    mine = str(getattr(props, "uuid", "")) or f"{getattr(props, 'pci_bus_id', '?')}:{dev.index}"
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def nvshmem_helpers(rank, world_size):
    """Symmetric tensors, barriers and collective frees; nvshmem_alltoall where NVSHMEM supports its
    collectives, and an EpkitError (not the end of the process) where it does not: several PEs on
    one GPU without MPS, which is how one GPU runs this suite."""
    dev = _device()
    assert epkit.nvshmem_my_pe() == rank and epkit.nvshmem_n_pes() == world_size
    gpus = _gpus_of_all_ranks(dev)
    shared = len(set(gpus)) < world_size
    supported = epkit.nvshmem_collectives_supported()
    # Peer mappings: every PE maps itself, PEs that share a GPU map each other, and a PE outside the
    # world is refused with the bound. (AllToAll's num_p2p_peers is checked against them below.)
    maps = [epkit.nvshmem_maps_peer(r) for r in range(world_size)]
    assert all(isinstance(v, bool) for v in maps) and maps[rank], f"rank {rank}: maps_peer gave {maps}"
    if len(set(gpus)) == 1:
        assert all(maps), f"rank {rank}: PEs on one GPU must map each other, maps_peer gave {maps}"
    _expect_error(lambda: epkit.nvshmem_maps_peer(world_size), f"maps_peer({world_size})", f"[0, {world_size})")
    _expect_error(lambda: epkit.nvshmem_maps_peer(-1), "maps_peer(-1)")
    # Refusing is allowed only where PEs share a GPU (with MPS NVSHMEM may still support them).
    assert supported or shared, f"rank {rank}: collectives reported unsupported with one PE per GPU ({gpus})"
    n = 64
    src = epkit.nvshmem_malloc([world_size, n], torch.float32, dev)
    dst = epkit.nvshmem_malloc((world_size, n), torch.float32, dev)
    assert src.shape == (world_size, n) and src.dtype == torch.float32 and src.device == dev
    src.copy_((rank * 100 + torch.arange(world_size, device=dev, dtype=torch.float32))[:, None].expand(world_size, n))
    dst.fill_(-1)
    torch.cuda.synchronize()  # every PE's dst is ready before any peer may write into it
    epkit.nvshmem_barrier_all()
    if supported:
        epkit.nvshmem_alltoall(dst, src)
        epkit.nvshmem_barrier_all_on_current_stream()
        torch.cuda.synchronize()
        want = (torch.arange(world_size, device=dev, dtype=torch.float32) * 100 + rank)[:, None].expand(world_size, n)
        assert torch.equal(dst, want), f"rank {rank}: nvshmem_alltoall gave {dst[:, 0].tolist()}, want {want[:, 0].tolist()}"
        plain = torch.empty_like(dst)  # torch's allocator, not the symmetric heap: must be refused
        _expect_error(lambda d=plain, s=src: epkit.nvshmem_alltoall(d, s), "nvshmem_malloc")
        del plain
    else:
        print(f"rank {rank}: {world_size} PEs on {len(set(gpus))} GPU(s): nvshmem_alltoall must raise", flush=True)
        _expect_error(lambda d=dst, s=src: epkit.nvshmem_alltoall(d, s), "limited MPG")
        # The extension's own check too, which the C++ Communicator backs up.
        _expect_error(lambda d=dst, s=src: epkit._C.alltoall(d.data_ptr(), s.data_ptr(), n * 4, 0), "limited MPG")
        # The process lives on: the barriers, and the data untouched.
        epkit.nvshmem_barrier_all_on_current_stream()
        torch.cuda.synchronize()
        assert (dst == -1).all(), f"rank {rank}: a refused nvshmem_alltoall wrote into dest"
    epkit.nvshmem_barrier_all()
    f8 = epkit.nvshmem_malloc([3, 32], FP8, dev)
    assert f8.dtype == FP8 and f8.shape == (3, 32)
    live = epkit._C.num_live_allocations()
    del src, dst, f8  # dropped at the same point on every rank: the collective frees match
    gc.collect()
    assert epkit._C.num_live_allocations() == live - 3

    # An AllToAll dropped without destroy() keeps its memory until finalize (which the harness runs).
    a = epkit.AllToAll(num_experts=2 * world_size, topk=1, hidden=128, max_tokens_per_rank=4)
    assert a.num_p2p_peers == sum(maps) - 1, f"rank {rank}: {a.num_p2p_peers} P2P peers, maps_peer gave {maps}"
    before = epkit._C.num_live_instances()
    del a
    gc.collect()
    assert epkit._C.num_live_instances() == before


def intranode_bootstrap(rank, world_size):
    """pplx-style intranode: no nvshmem_init by the caller; epkit bootstraps over torch.distributed."""
    assert not epkit.nvshmem_initialized()
    p = problem(world_size, 1, "bf16")
    ata = epkit.pplx.AllToAll.intranode(p.max_tokens, p.num_experts, p.topk, rank, world_size, 1,
                                   p.hidden, p.hidden_dim_bytes, 0, group_name="default")
    assert epkit.nvshmem_my_pe() == rank
    compat_round(ata, p, rank, seed=11, variant="fused_host_m", rtol=1e-2, tag=f"intranode rank={rank}")
    ata.destroy()


class _Compiled:
    """ata with dispatch and combine replaced by torch.compile of them, as pplx-kernels users write."""

    def __init__(self, ata, fullgraph):
        self.impl = ata.impl
        self.dispatch = torch.compile(ata.dispatch, fullgraph=fullgraph)
        self.combine = torch.compile(ata.combine, fullgraph=fullgraph)


# (payload, expert_y, out_tokens, variants) for the compiled calls: both element sizes, mixed dtypes,
# fused and split, device m (fixed shapes, as under CUDA graphs) and host m.
COMPILE_CASES = [
    (FP16, BF16, FP16, ("fused_device_m", "split_device_m", "fused_host_m")),
    (FP8, FP16, BF16, ("fused_device_m",)),
]


def torch_compile(rank, world_size, dp_size):
    """torch.compile(ata.dispatch) / torch.compile(ata.combine), in two passes: (1) the fallback, each
    call a graph break run eagerly (epkit._ops.use_ops = False), which must run correctly; (2) the
    default, the calls traced as the custom ops of epkit._ops, with fullgraph=True (no graph break
    allowed). Every layer is checked against the reference."""
    import torch._dynamo
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)  # one compile per (dtypes, halves, m kind): keep them all
    try:
        import torch._inductor.config as inductor_config
        inductor_config.compile_threads = 1  # no worker pool per rank: these graphs hold one op
    except (ImportError, AttributeError):
        pass
    default_use_ops = epkit._ops.use_ops
    passed = []
    for label, use_ops, fullgraph in (("graph breaks", False, False), ("custom ops, fullgraph=True", True, True)):
        torch._dynamo.reset()
        epkit._ops.use_ops = use_ops
        try:
            for i, (d, cin, cout, variants) in enumerate(COMPILE_CASES):
                p = combo_problem(world_size, dp_size, d, cin, cout)
                ata = pplx_all_to_all(p, rank)
                compiled = _Compiled(ata, fullgraph)
                for j, variant in enumerate(variants):
                    tag = (f"torch.compile ({label}) dp_x {dname(d)} expert_y {dname(cin)} "
                           f"out_tokens {dname(cout)} {variant} rank={rank}")
                    compat_round(compiled, p, rank, seed=700 + 10 * i + j, variant=variant, rtol=RTOL_OUT[cout],
                                 tag=tag)
                ata.destroy()
        except Exception as e:
            raise AssertionError(f"rank {rank}: torch.compile, {label}: {type(e).__name__}: {e} (passed before it: "
                                 f"{passed or 'none'}; custom ops: {epkit._ops.UNAVAILABLE or 'registered'})") from e
        finally:
            epkit._ops.use_ops = default_use_ops
        passed.append(label)


def world_size_1_without_nvshmem(rank, world_size):
    """epkit.AllToAll at world size 1 in a process that never initialized NVSHMEM: the idiomatic and
    weights-at-dispatch cases, and CUDA graph capture, on the single-process object."""
    assert world_size == 1 and not epkit.nvshmem_initialized()
    idiomatic(rank, world_size)
    weights_at_dispatch(rank, world_size, 1)
    native_graph(rank, world_size)
    assert not epkit.nvshmem_initialized()


def native_graph(rank, world_size):
    """dispatch -> experts -> combine of the native API captured in one CUDA graph with m on the
    device, replayed for fresh inputs and m in {M, 5, 17, 0}."""
    dev = _device()
    p = problem(world_size, 1, "fp8")
    cfg = epkit.AllToAllConfig(num_experts=p.num_experts, topk=TOP_K, hidden=HIDDEN, max_tokens_per_rank=MAX_TOKENS,
                               dispatch_dtype="fp8_e4m3")
    with epkit.AllToAll(cfg) as ata:
        x = torch.zeros(p.max_tokens, p.hidden, device=dev).to(p.payload)
        x_scale = torch.ones(p.max_tokens, p.num_scales, device=dev)
        idx = torch.zeros(p.max_tokens, p.topk, dtype=torch.int32, device=dev)
        w = torch.zeros(p.max_tokens, p.topk, device=dev)
        m_dev = torch.zeros(1, dtype=torch.int32, device=dev)
        d = ata.empty_dispatch_output()
        expert_y = torch.empty(ata.expert_shape(), dtype=p.combine_in, device=dev)
        out = torch.empty(p.max_tokens, p.hidden, dtype=p.combine_out, device=dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ata.dispatch(x, idx, x_scale, num_tokens=m_dev, out=d)
            expert_y.copy_(expert_forward(p, rank, d.expert_x, d.expert_x_scale, d.expert_num_tokens))
            ata.combine(expert_y, idx, w, num_tokens=m_dev, out=out)
        for it, m in enumerate([p.max_tokens, 5, 17, 0]):
            tag = f"native graph W={world_size} replay#{it} m={m}"
            groups = all_groups(p, 1300 + it, dev, m=m)
            mine = groups[rank]
            px, pscale, pidx, pw = _padded(mine, p, p.max_tokens)
            x.copy_(px)
            x_scale.copy_(pscale)
            idx.copy_(pidx.view(torch.int32) if pidx.dtype != torch.int32 else pidx)
            w.copy_(pw)
            m_dev.fill_(m)
            d.expert_x.view(torch.uint8).fill_(0xFF)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ata.check()
            check_dispatch(p, rank, groups, d.expert_num_tokens, d.expert_x, d.expert_x_scale, tag)
            check_combine(p, mine, out, PAYLOADS["fp8"][3], tag, untouched_from=m)
