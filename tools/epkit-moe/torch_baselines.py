#!/usr/bin/env python3
"""What a torch user already has for the MoE kernels, timed with epkit-moe's method, into its JSON.

Run after `epkit-moe kernels --json FILE`: this script reads FILE's ceilings, times the same shapes
through torch and writes its rows into FILE (rows of its own systems are replaced, epkit's kept):

  * grouped GEMM over the masked layout [G, m, K] x [G, N, K]^T: torch._scaled_grouped_mm with
    row-wise FP8 scales ("torch_scaled_grouped_mm") and a bf16 torch.bmm ("torch_bmm_bf16", twice
    the weight bytes);
  * the router (DeepSeek grouped top-k and softmax top-k) written in torch ops ("torch");
  * 1x128 FP8 activation quantization and SiLU*mul + quantization in torch ops ("torch").

Method: epkit-moe's (graph_timing.py); median and p99 over the replays; inputs rotated over sets
that together exceed 4x the L2.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from graph_timing import Flush, finish, p99, pick_repeats, rotation_sets, time_graphs

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
H, I = 7168, 2048
SYSTEMS = ("torch_scaled_grouped_mm", "torch_bmm_bf16", "torch")


def run_point(rows, ceil, flush, base, est_us, fn):
    calls, replays = pick_repeats(est_us)
    try:
        us = time_graphs(torch, flush, calls, replays, [fn])[0]
        med, p = statistics.median(us), p99(us)
    except Exception as e:  # a system that cannot run a shape says so in the row
        r = dict(base, us_median=None, note=f"failed: {type(e).__name__}: {str(e)[:200]}")
        rows.append(r)
        print(f"  {base['kernel']:18s} {base['system']:24s} {base['variant']:22s} G={base['G']} m={base['m']}: {r['note']}")
        return
    r = finish(dict(base, us_median=med, us_p99=p, calls=calls, replays=replays), ceil)
    rows.append(r)
    print(f"  {r['kernel']:18s} {r['system']:24s} {r['variant']:22s} G={r['G']:<3d} m={r['m']:<5d} "
          f"{med:9.2f} us {r['GBps']:8.1f} GB/s {r['TFLOPs']:7.1f} TFLOP/s {r['pct_of_ceiling']:5.1f}% of {r['bound']}",
          flush=True)


def row(kernel, system, variant, G, m, N, K, nbytes, wbytes=0.0, flops=0.0):
    return dict(kernel=kernel, system=system, variant=variant, G=G, m=m, N=N, K=K, bytes=float(nbytes),
                weight_bytes=float(wbytes), flops=float(flops))


def bench_gemm(rows, ceil, flush, l2, groups, ms):
    for name, n, k in (("up_gate", 4096, 7168), ("down", 7168, 2048)):
        for G in groups:
            for m in ms:
                wb = G * n * k
                per = wb + G * m * k + G * m * n * 2
                sets = rotation_sets(per, l2, 20)
                if per * sets > (40 << 30):
                    continue
                a = [torch.randn(G, m, k, device="cuda").clamp_(-2, 2).to(FP8) for _ in range(sets)]
                b = [torch.randn(G, n, k, device="cuda").clamp_(-2, 2).to(FP8) for _ in range(sets)]
                sa = [torch.rand(G, m, device="cuda") * 0.01 + 0.01 for _ in range(sets)]
                sb = [torch.rand(G, n, device="cuda") * 0.01 + 0.01 for _ in range(sets)]
                flops = 2.0 * G * m * n * k
                run_point(rows, ceil, flush, row("grouped_gemm", "torch_scaled_grouped_mm", name, G, m, n, k, per, wb, flops),
                          max(per / 2e6, flops / 6e8), lambda i: torch._scaled_grouped_mm(
                              a[i % sets], b[i % sets].transpose(-2, -1), sa[i % sets], sb[i % sets],
                              out_dtype=torch.bfloat16))
                del a, sa, sb
                # bf16 bmm: twice the weight bytes (what a user without FP8 kernels runs).
                wb16 = 2 * wb
                per16 = wb16 + 2 * G * m * k + 2 * G * m * n
                sets16 = rotation_sets(per16, l2, 20)
                if per16 * sets16 <= (40 << 30):
                    b16 = [bb.to(torch.bfloat16) for bb in b[:sets16]]
                    b16 += [b16[0].clone() for _ in range(sets16 - len(b16))]
                    x16 = [torch.randn(G, m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets16)]
                    run_point(rows, ceil, flush, row("grouped_gemm", "torch_bmm_bf16", name, G, m, n, k, per16, wb16, flops),
                              max(per16 / 2e6, flops / 4e8), lambda i: torch.bmm(x16[i % sets16], b16[i % sets16].transpose(-2, -1)))
                    del b16, x16
                del b
                torch.cuda.empty_cache()


def router_grouped_topk(logits, bias, n_group, topk_group, k, scaling):
    """DeepSeek-V3 noaux_tc in torch ops (the HF modeling code's recipe)."""
    s = logits.float().sigmoid()
    sb = s + bias
    m, e = sb.shape
    group = sb.view(m, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    gidx = group.topk(topk_group, dim=-1, sorted=False).indices
    gmask = torch.zeros_like(group).scatter_(1, gidx, 1.0)
    emask = gmask.unsqueeze(-1).expand(m, n_group, e // n_group).reshape(m, e)
    idx = sb.masked_fill(emask == 0, float("-inf")).topk(k, dim=-1, sorted=False).indices
    w = s.gather(1, idx)
    return idx.to(torch.int32), w / w.sum(-1, keepdim=True) * scaling


def router_softmax_topk(logits, k):
    p = logits.float().softmax(-1)
    w, idx = p.topk(k, dim=-1)
    return idx.to(torch.int32), w / w.sum(-1, keepdim=True)


def quant_1x128(x):
    m, h = x.shape
    xf = x.float().view(m, h // 128, 128)
    scale = xf.abs().amax(-1, keepdim=True).clamp_(min=1e-10) / FP8_MAX
    return (xf / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8).view(m, h), scale.view(m, h // 128)


def bench_small(rows, ceil, flush, l2, ms, quick):
    tokens = [128, 4096] if quick else [1, 16, 128, 512, 4096, 16384]
    for m in tokens:
        e, k = 256, 8
        per = m * e * 4 + e * 4 + m * k * 8
        sets = rotation_sets(per, l2, 20)
        lg = [torch.randn(m, e, device="cuda") * 4 for _ in range(sets)]
        bias = torch.randn(e, device="cuda") * 0.1
        run_point(rows, ceil, flush, row("router", "torch", "deepseek_grouped_topk", 1, m, e, k, per), per / 1e6 + 50,
                  lambda i: router_grouped_topk(lg[i % sets], bias, 8, 4, k, 2.5))
        e, k = 8, 2
        per = m * e * 4 + m * k * 8
        sets = rotation_sets(per, l2, 20)
        lg = [torch.randn(m, e, device="cuda") * 4 for _ in range(sets)]
        run_point(rows, ceil, flush, row("router", "torch", "mixtral_softmax_topk", 1, m, e, k, per), per / 1e6 + 20,
                  lambda i: router_softmax_topk(lg[i % sets], k))
        per = m * H * 2 + m * H + m * (H // 128) * 4
        sets = rotation_sets(per, l2, 20)
        xs = [torch.randn(m, H, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        run_point(rows, ceil, flush, row("quantize", "torch", "activations", 1, m, H, 0, per), per / 1e6 + 20,
                  lambda i: quant_1x128(xs[i % sets]))
        del xs, lg
    for G in ([32] if quick else [8, 32]):
        for m in ms:
            per = G * m * 2 * I * 2 + G * m * I + G * m * (I // 128) * 4
            sets = rotation_sets(per, l2, 20)
            if per * sets > (24 << 30):
                continue
            hs = [torch.randn(G, m, 2 * I, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]

            def silu_quant(i):
                h = hs[i % sets]
                a = F.silu(h[..., :I].float()) * h[..., I:].float()
                return quant_1x128(a.view(G * m, I))

            run_point(rows, ceil, flush, row("silu_mul_quantize", "torch", "masked", G, m, I, 0, per), per / 1e6 + 20,
                      silu_quant)
            del hs
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="epkit-moe kernels' JSON (read for the ceilings, rewritten with torch rows)")
    ap.add_argument("--kernels", default="router,quantize,silu_mul_quantize,grouped_gemm")
    ap.add_argument("--groups", default="2,8,16,32,64")
    ap.add_argument("--m", default="1,4,8,16,32,64,128,256,512,1024,4096")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_baselines.py: no GPU; nothing to time")
        return 0
    with open(args.json) as f:
        doc = json.load(f)
    ceil = doc["ceilings"]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = Flush(torch, l2)
    kernels = args.kernels.split(",")
    groups = [int(x) for x in args.groups.split(",")]
    ms = [int(x) for x in args.m.split(",") if int(x) > 0]
    rows = []
    if "grouped_gemm" in kernels:
        print("== grouped_gemm (torch)")
        bench_gemm(rows, ceil, flush, l2, groups, ms)
    if {"router", "quantize", "silu_mul_quantize"} & set(kernels):
        print("== router / quantize / silu_mul_quantize (torch)")
        bench_small(rows, ceil, flush, l2, ms, args.quick)
    doc["rows"] = [r for r in doc["rows"] if r["system"] not in SYSTEMS] + rows
    doc.setdefault("meta", {})["torch"] = torch.__version__
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {len(rows)} torch rows into {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
