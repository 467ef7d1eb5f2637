"""Bodies of test_fault.py: a peer that stops mid-dispatch or mid-combine, through each Python API.

Every rank runs iterations of dispatch + expert + combine (checked against the reference) on one
API. In iteration FAULT_ITERATION the last rank (the victim) stops:
  kill            dies (SIGKILL) before its dispatch          -> the others wait in dispatch
  skip-dispatch   stays alive, never dispatches               -> dispatch
  skip            dispatches, then never combines (alive)     -> combine
  kill-combine    dispatches, then dies                       -> combine
Each survivor must get EpkitError naming the phase it waited in and the victim, within the device
timeout plus a margin; its next call must raise at once (the object, or the MoELayer, is unusable and
launches nothing); nvshmem_finalize must return promptly. The results go to a JSON file per rank,
which the parent (test_fault.py) checks; the survivor then leaves with os._exit (torch.distributed's
own teardown with a dead peer is not epkit's to test).
"""

import json
import os
import signal
import time

import torch
import torch.distributed as dist

FAULT_ITERATION = 3
BF16 = torch.bfloat16


def after_dispatch(mode: str) -> bool:
    return mode in ("skip", "kill-combine")


def expected_phase(mode: str) -> str:
    return "combine" if after_dispatch(mode) else "dispatch"


def _stop(rank: int, mode: str) -> None:
    print(f"rank {rank}: stopping ({mode}) in iteration {FAULT_ITERATION}", flush=True)
    if mode.startswith("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600)  # alive but silent; the parent kills it after the survivors reported
    os._exit(0)


def _after_error(err, t0, it, retry, **extra):
    """What a survivor reports: the error, how long it took, and whether the next call refused at once."""
    r = {"error": str(err), "ms": (time.monotonic() - t0) * 1000, "iteration": it}
    torch.cuda.synchronize()
    t1 = time.monotonic()
    try:
        retry()
        torch.cuda.synchronize()
        r["reuse"] = None
    except Exception as e:  # noqa: BLE001 - the parent checks the type by name
        r["reuse"] = f"{type(e).__name__}: {e}"
    r["reuse_ms"] = (time.monotonic() - t1) * 1000
    r.update(extra)
    return r


def _problem(W):
    from _reference import Problem
    return Problem(W, 1, num_experts=4 * W, topk=3, hidden=256, max_tokens=8, payload=BF16, combine_in=BF16,
                   combine_out=BF16)


def native(rank, W, mode, victim):
    import epkit
    from _reference import all_groups, check_combine, check_dispatch, expert_forward
    dev = torch.device("cuda", torch.cuda.current_device())
    p = _problem(W)
    ata = epkit.AllToAll(num_experts=p.num_experts, topk=p.topk, hidden=p.hidden, max_tokens_per_rank=p.max_tokens,
                         world_size=W, rank=rank)
    for it in range(2 * FAULT_ITERATION):
        groups = all_groups(p, 1000 + it, dev)
        mine = groups[rank]
        if it == FAULT_ITERATION and rank == victim:
            if after_dispatch(mode):
                ata.dispatch(mine.x, mine.idx)
                torch.cuda.synchronize()
            _stop(rank, mode)
        t0 = time.monotonic()
        try:
            d = ata.dispatch(mine.x, mine.idx)
            torch.cuda.synchronize()
            ata.check()
            check_dispatch(p, rank, groups, d.expert_num_tokens, d.expert_x, d.expert_x_scale, f"native it {it}")
            y = expert_forward(p, rank, d.expert_x, d.expert_x_scale, d.expert_num_tokens)
            out = ata.combine(y, mine.idx, mine.weights)
            torch.cuda.synchronize()
            ata.check()
            check_combine(p, mine, out, 1e-2, f"native it {it}")
        except epkit.EpkitError as e:
            return _after_error(e, t0, it, lambda: ata.dispatch(mine.x, mine.idx))
    return {"error": None}


def pplx(rank, W, mode, victim):
    """As a pplx-kernels caller: no check(); a timeout surfaces as EpkitError from the next call."""
    import epkit
    from _cases import as_u32
    from _reference import all_groups, check_combine, expert_forward
    dev = torch.device("cuda", torch.cuda.current_device())
    p = _problem(W)
    ata = epkit.pplx.AllToAll.internode(p.max_tokens, p.num_experts, p.topk, rank, W, 1, p.hidden, p.hidden_dim_bytes,
                                        0)
    L, C = p.num_local_experts, p.capacity
    t0, fault_it = None, None
    for it in range(2 * FAULT_ITERATION):
        groups = all_groups(p, 2000 + it, dev)
        mine = groups[rank]
        idx = as_u32(mine.idx)
        cnt = torch.empty(L, dtype=torch.int32, device=dev)
        ex = torch.empty(L, C, p.hidden, dtype=BF16, device=dev)
        if it == FAULT_ITERATION and rank == victim:
            if after_dispatch(mode):
                ata.dispatch(cnt, ex, None, mine.x, None, idx, None)
                torch.cuda.synchronize()
            _stop(rank, mode)
        if it == FAULT_ITERATION:
            t0, fault_it = time.monotonic(), it
        try:
            ata.dispatch(cnt, ex, None, mine.x, None, idx, None)
            y = expert_forward(p, rank, ex, None, cnt)
            out = torch.empty(p.max_tokens, p.hidden, dtype=BF16, device=dev)
            ata.combine(out, idx, mine.weights, y, None)
            torch.cuda.synchronize()
            if it < FAULT_ITERATION:
                check_combine(p, mine, out, 1e-2, f"pplx it {it}")
        except epkit.EpkitError as e:
            return _after_error(e, t0 if t0 is not None else time.monotonic(), it,
                                lambda: ata.dispatch(cnt, ex, None, mine.x, None, idx, None), fault_iteration=fault_it)
    return {"error": None}


def deep_ep(rank, W, mode, victim):
    """deep_ep.Buffer low-latency dispatch/combine; as a DeepEP caller: the next call raises."""
    import epkit.deep_ep as dep
    import epkit
    import _deep_ep_cases as D
    dev = torch.device("cuda", torch.cuda.current_device())
    E, H, M = 4 * W, 256, D.LL_M
    L = E // W
    buf = dep.Buffer(dist.group.WORLD, low_latency_mode=True, num_qps_per_rank=L)
    t0, fault_it = None, None
    for it in range(2 * FAULT_ITERATION):
        inputs = D._ll_inputs(3000, it, W, E, H, M)
        x, idx, w = (t.to(dev) for t in inputs[rank])
        if it == FAULT_ITERATION and rank == victim:
            if after_dispatch(mode):
                buf.low_latency_dispatch(x, idx, M, E, use_fp8=False)
                torch.cuda.synchronize()
            _stop(rank, mode)
        if it == FAULT_ITERATION:
            t0, fault_it = time.monotonic(), it
        try:
            recv, counts, handle, _, _ = buf.low_latency_dispatch(x, idx, M, E, use_fp8=False)
            torch.cuda.synchronize()
            y = D._expert_y(recv, None, counts.cpu(), rank, L, False)
            out, _, _ = buf.low_latency_combine(y, idx, w, handle)
            torch.cuda.synchronize()
            if it < FAULT_ITERATION:
                D._ll_check_combine(f"deep_ep it {it}", out, inputs[rank][0], inputs[rank][1], inputs[rank][2], rank, W,
                                    E, False, False)
        except epkit.EpkitError as e:
            return _after_error(e, t0 if t0 is not None else time.monotonic(), it,
                                lambda: buf.low_latency_dispatch(x, idx, M, E, use_fp8=False), fault_iteration=fault_it)
    return {"error": None}


def layer(rank, W, mode, victim):
    """MoELayer (schedule dispatch_overlap); the victim stops after stage_route (dispatch modes) or
    after stage_dispatch_send (combine modes). After the error, forward must refuse at once and leave
    its output untouched."""
    import epkit
    import _moe_cases as MC
    dev = torch.device("cuda", torch.cuda.current_device())
    md = MC.make_model(4000, MC.num_experts(W), dev)
    lay = epkit.MoELayer(MC.config(W, rank, schedule="dispatch_overlap"), **MC.layer_weights(md, W, rank))
    M = MC.MAX_TOKENS
    for it in range(2 * FAULT_ITERATION):
        x = MC.tokens(5000 + 100 * it + rank, M, dev)
        out = MC.poison_bf16(torch.empty(M, MC.HIDDEN, dtype=BF16, device=dev))
        if it == FAULT_ITERATION and rank == victim:
            lay.begin(x, out, num_tokens=M)
            lay.stage_route(0)
            if after_dispatch(mode):
                lay.stage_dispatch_send(0)
            torch.cuda.synchronize()
            _stop(rank, mode)
        t0 = time.monotonic()
        try:
            lay.forward(x, out, num_tokens=M)
            torch.cuda.synchronize()
            lay.check()
            MC.check_forward(lay, md, x, out, M, False, f"layer it {it}")
        except epkit.EpkitError as e:
            again = MC.poison_bf16(torch.empty(M, MC.HIDDEN, dtype=BF16, device=dev))
            r = _after_error(e, t0, it, lambda: lay.forward(x, again, num_tokens=M))
            torch.cuda.synchronize()
            r["reuse_wrote_output"] = not bool((again.view(torch.int16) == -1).all())
            return r
    return {"error": None}


BODIES = {"native": native, "pplx": pplx, "deep_ep": deep_ep, "layer": layer}


def entry(rank, W, port, api, mode, timeout_ms, out_dir):
    """One rank (spawned): NVSHMEM up over gloo, the body, then (survivors) the report."""
    os.environ["EPKIT_TIMEOUT_MS"] = str(timeout_ms)  # read when the objects are created
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    import epkit
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W)
    uid = epkit.nvshmem_get_unique_id() if rank == 0 else epkit.nvshmem_alloc_empty_unique_id()
    dist.broadcast(uid, src=0)
    epkit.nvshmem_init(uid, rank, W)
    victim = W - 1
    res = {"rank": rank}
    try:
        res.update(BODIES[api](rank, W, mode, victim))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the test with it
        res["unexpected"] = f"{type(e).__name__}: {e}"
    t0 = time.monotonic()
    try:
        epkit.nvshmem_finalize()
        res["finalize"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["finalize"] = f"{type(e).__name__}: {e}"
    res["finalize_ms"] = (time.monotonic() - t0) * 1000
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(0)
