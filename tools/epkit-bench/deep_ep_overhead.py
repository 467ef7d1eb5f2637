#!/usr/bin/env python3
"""What epkit.deep_ep (DeepEP's API) costs over epkit's native calls, and its memory against DeepEP's.

    python3 tools/epkit-bench/deep_ep_overhead.py [--ranks 1] [--tokens 1,128] [--json FILE]
                                                   [--memory-ranks 8] [--pairs 20] [--rounds 40]

Needs an importable epkit (pip install, or PYTHONPATH=build/python) and a GPU. Spawns --ranks
processes (rank r on GPU r % device_count, NVSHMEM over a gloo-broadcast unique id, as the Python
tests do) and times, in the same processes, at the DeepSeek-V3 decode shape (H 7168, E 256, top-8,
num_max_dispatch_tokens_per_rank 128, fp8 dispatch with 1x128 scales, bf16 combine) and at each
--tokens count, one low-latency dispatch + combine pair through

  * native: epkit.quantize + AllToAll.dispatch (+ combine) into preallocated outputs, the calls an
    engine written for epkit makes; bf16: dispatch without the quantization;
  * deep_ep: Buffer.low_latency_dispatch(x bf16, use_fp8=...) + low_latency_combine(out=...), the
    calls vLLM and SGLang make (DeepEP allocates the receive tensors per call; so does the wrapper;
    fp8 adds the copy of the scales into DeepEP's column-major layout);

eager (CUDA events over --pairs back-to-back pairs, and the host's time to issue them, with the
wrapper's expert-index check on, which synchronises, and off) and replayed from one CUDA graph of
--pairs pairs. Each figure is the median over --rounds rounds, native and deep_ep rounds
interleaved. With more ranks than GPUs the ranks time-slice a GPU and the times mean nothing (the
JSON says so); use one rank per GPU.

Then --memory-ranks ranks (default 8; several may share a GPU, only sizes are read) create a Buffer,
run one low-latency pair at the EP8 decode configuration (128 tokens per rank, H 7168, E 256, top-8)
and report the NVSHMEM symmetric bytes its AllToAll holds against DeepEP's
get_low_latency_rdma_size_hint for the same configuration (DeepEP V1's formula, csrc/config.hpp).

The JSON carries the date, the commit the epkit extension was built from, the GPU and this method.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

H, E, K, M = 7168, 256, 8, 128
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, world_size, port, bootstrap):
    import epkit
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    if bootstrap:
        uid = epkit.nvshmem_get_unique_id() if rank == 0 else epkit.nvshmem_alloc_empty_unique_id()
        dist.broadcast(uid, src=0)
        epkit.nvshmem_init(uid, rank, world_size)
    return epkit


def _inputs(rank, m, dev):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(m, H, generator=g).to(BF16).to(dev)
    idx = torch.rand(m, E, generator=g).topk(K, dim=1).indices.to(torch.int64).to(dev)
    w = torch.rand(m, K, generator=g).to(dev)
    return x, idx, w


def _median_rounds(measure, rounds):
    """measure() -> (gpu_us_per_pair, host_us_per_pair); medians over rounds."""
    gpu, host = [], []
    for _ in range(rounds):
        g, h = measure()
        gpu.append(g)
        host.append(h)
    return statistics.median(gpu), statistics.median(host)


def _timing_rank(rank, world_size, port, args, queue):
    epkit = _init(rank, world_size, port, True)
    import epkit.deep_ep as deep_ep

    dev = torch.device("cuda", torch.cuda.current_device())
    L = E // world_size
    N = world_size * M
    results = []
    natives = {}
    buffers = {checks: deep_ep.Buffer(dist.group.WORLD, 0, deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, world_size, E),
                                      low_latency_mode=True, num_qps_per_rank=L, host_checks=checks)
               for checks in (False, True)}
    y = torch.zeros(L, N, H, dtype=BF16, device=dev)
    for payload in ("fp8", "bf16"):
        fp8 = payload == "fp8"
        ata = natives[payload] = epkit.AllToAll(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=M,
                                                dispatch_dtype=FP8 if fp8 else BF16)
        d_out = ata.empty_dispatch_output()
        for m in args.tokens:
            x, idx, w = _inputs(rank, m, dev)
            out_native = torch.empty(m, H, dtype=BF16, device=dev)
            out_dep = torch.empty(m, H, dtype=BF16, device=dev)
            q = epkit.quantize(x) if fp8 else None

            def native_pair():
                if fp8:
                    epkit.quantize(x, out=q)
                    ata.dispatch(q.q, idx, q.scale, out=d_out)
                else:
                    ata.dispatch(x, idx, out=d_out)
                ata.combine(y, idx, w, out=out_native)

            def deep_ep_pair(buf):
                _, _, handle, _, _ = buf.low_latency_dispatch(x, idx, M, E, use_fp8=fp8)
                buf.low_latency_combine(y, idx, w, handle, out=out_dep)

            variants = {"native": native_pair,
                        "deep_ep": lambda: deep_ep_pair(buffers[False]),
                        "deep_ep_host_checks": lambda: deep_ep_pair(buffers[True])}
            for fn in variants.values():  # warm-up: creates the objects, JIT-free paths
                for _ in range(3):
                    fn()
            torch.cuda.synchronize()
            dist.barrier()

            def eager(fn):
                def measure():
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    dist.barrier()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    start.record()
                    for _ in range(args.pairs):
                        fn()
                    end.record()
                    t1 = time.perf_counter()
                    end.synchronize()
                    return start.elapsed_time(end) * 1e3 / args.pairs, (t1 - t0) * 1e6 / args.pairs
                return measure

            graphs = {}
            for name in ("native", "deep_ep"):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(args.pairs):
                        variants[name]()
                graphs[name] = g
            torch.cuda.synchronize()
            dist.barrier()

            def replay(g):
                def measure():
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    dist.barrier()
                    torch.cuda.synchronize()
                    start.record()
                    g.replay()
                    end.record()
                    end.synchronize()
                    return start.elapsed_time(end) * 1e3 / args.pairs, float("nan")
                return measure

            per = {}
            samples = {k: ([], []) for k in ("native/eager", "deep_ep/eager", "deep_ep_host_checks/eager",
                                             "native/graph", "deep_ep/graph")}
            for _ in range(args.rounds):  # interleaved, so drift hits both alike
                for name, meas in (("native/eager", eager(native_pair)), ("deep_ep/eager", eager(variants["deep_ep"])),
                                   ("deep_ep_host_checks/eager", eager(variants["deep_ep_host_checks"])),
                                   ("native/graph", replay(graphs["native"])),
                                   ("deep_ep/graph", replay(graphs["deep_ep"]))):
                    gpu_us, host_us = meas()
                    samples[name][0].append(gpu_us)
                    samples[name][1].append(host_us)
            for name, (g_s, h_s) in samples.items():
                api, mode = name.split("/")
                per[name] = dict(api=api, mode=mode, tokens=m, payload=payload,
                                 us_per_pair=statistics.median(g_s),
                                 host_us_per_pair=None if mode == "graph" else statistics.median(h_s))
                results.append(per[name])
            for mode in ("eager", "graph"):
                results.append(dict(api="overhead", mode=mode, tokens=m, payload=payload,
                                    us_per_pair=per[f"deep_ep/{mode}"]["us_per_pair"] - per[f"native/{mode}"]["us_per_pair"],
                                    host_us_per_pair=None if mode == "graph" else
                                    per["deep_ep/eager"]["host_us_per_pair"] - per["native/eager"]["host_us_per_pair"]))
            del graphs
    for ata in natives.values():
        ata.destroy()
    if rank == 0:
        queue.put(dict(results=results, gpu=torch.cuda.get_device_name(), device_count=torch.cuda.device_count()))
    torch.cuda.synchronize()
    epkit.nvshmem_finalize()
    dist.destroy_process_group()


def _memory_rank(rank, world_size, port, queue):
    epkit = _init(rank, world_size, port, False)  # the Buffer bootstraps NVSHMEM itself, as in an engine
    import epkit.deep_ep as deep_ep

    dev = torch.device("cuda", torch.cuda.current_device())
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, world_size, E)
    buf = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world_size)
    x, idx, w = _inputs(rank, M, dev)
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, M, E, use_fp8=True)
    y = torch.zeros(E // world_size, world_size * M, H, dtype=BF16, device=dev)
    buf.low_latency_combine(y, idx, w, handle)
    torch.cuda.synchronize()
    sym = buf.symmetric_bytes
    p2p = sum(epkit.nvshmem_maps_peer(p) for p in range(world_size))
    if rank == 0:
        queue.put(dict(world_size=world_size, epkit_symmetric_bytes=sym, deepep_low_latency_rdma_size_hint=hint,
                       ratio=hint / sym, peers_mapped=p2p,
                       note=("one AllToAll (one dispatch in flight); a second dispatch in flight before the first is "
                             "combined (dual-batch overlap) creates a second one of the same size")))
    epkit.nvshmem_finalize()
    dist.destroy_process_group()


def _spawn(fn, world_size, *args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=fn, args=(r, world_size, port) + args + (queue,)) for r in range(world_size)]
    for p in procs:
        p.start()
    out = queue.get(timeout=1800)
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise RuntimeError(f"{fn.__name__}: a rank exited with {p.exitcode}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")], default=[1, 128])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--memory-ranks", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("deep_ep_overhead: no GPU on this machine; nothing to time")
        return 0
    timing = _spawn(_timing_rank, args.ranks, args)
    memory = _spawn(_memory_rank, args.memory_ranks) if args.memory_ranks else None
    shared = args.ranks > timing["device_count"]
    import epkit
    doc = dict(
        benchmark="deep_ep_overhead", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=epkit.git_commit, gpu=timing["gpu"], world_size=args.ranks,
        note=("several ranks share a GPU: these times mean nothing" if shared else None),
        config=dict(hidden=H, num_experts=E, topk=K, num_max_dispatch_tokens_per_rank=M, tokens=args.tokens),
        method=("per pair = one low-latency dispatch + combine; eager: CUDA events over --pairs back-to-back pairs "
                "(host_us_per_pair: the host's time to issue them, no sync inside); graph: one CUDA graph of --pairs "
                "pairs replayed, events per replay / pairs; medians over --rounds rounds, native and deep_ep "
                "interleaved; overhead = deep_ep - native. native fp8 = epkit.quantize + AllToAll.dispatch + combine "
                "into preallocated outputs; deep_ep = Buffer.low_latency_dispatch(x bf16) + low_latency_combine(out=), "
                "host_checks off unless named"),
        pairs=args.pairs, rounds=args.rounds, results=timing["results"], memory=memory)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
