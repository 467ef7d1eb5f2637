#!/usr/bin/env python3
"""One MoE block of each family, as a Hugging Face transformers user runs it, against epkit.

For DeepSeek-V3 (DeepseekV3MoE: 256 experts, grouped top-8, shared expert), Qwen3-MoE
(Qwen3MoeSparseMoeBlock, Qwen3-30B-A3B sizes: 128 experts, top-8) and Mixtral (MixtralSparseMoeBlock,
8x7B sizes: 8 experts, top-2), built from transformers' own classes with random weights at the
models' real sizes, times at each batch (tokens per call), all in one run:

  eager, batched_mm, grouped_mm  transformers' experts implementations (bf16 weights); batched_mm
                                 only where its gathered weights fit (it copies every token's
                                 experts), as transformers' generate() uses it for decoding
  deepgemm                       transformers' DeepGEMM implementation, where it loads (else the row
                                 says why)
  epkit                          the same block with experts_implementation="epkit" (router and
                                 shared expert still transformers', bf16)
  patch_moe                      the block replaced by epkit.transformers.convert_block: one
                                 epkit.MoELayer (gate, router, experts and shared expert in FP8)

Each system runs in two modes: "eager" (back-to-back Python calls, what a user's loop sees,
CPU launch overhead included) and "graph" (the same calls captured in one CUDA graph, replayed;
systems that synchronise the host, like transformers' eager implementation, cannot be captured).
Method of both: N calls (inputs differing per call, so routing differs) per timed region, the L2
flushed before every region (untimed), CUDA events around it, divided by N; median over R regions.

The weight-read floor of a point is the bytes of the weights its tokens touch (the distinct routed
experts of each call's routing, counted on the device, plus the shared expert and the router's
gate) over the HBM read rate measured in the same run (the best of torch reductions over 4 GiB: a
lower bound of what a dedicated read kernel reaches; epkit-moe's measured 4633 GB/s on one H200).
FP8 weights (epkit) are half the bytes of bf16 ones (transformers), plus 1/4096 for the scales.

The expert weights are exactly FP8 (power-of-two 128x128 tile scales, one element per tile at 448),
so the bf16 block and epkit compute with identical weights; rel_err_vs_eager is then epkit's FP8
activation rounding (~4%).

Writes JSON (--json, e.g. bench/results/transformers-h200-latest.json) with meta (date, commit,
GPU, method), the ceiling, every row, the speedups over grouped_mm and the issue's target
(DeepSeek-V3's block >= 3x grouped_mm at batch <= 128).

  python3 tools/epkit-moe/transformers_bench.py --json bench/results/transformers-h200-latest.json
  python3 tools/epkit-moe/transformers_bench.py --quick          # fewer repeats, batches 1 and 128
"""
import argparse
import datetime
import importlib
import importlib.util
import json
import math
import os
import statistics
import sys
import time

import torch

from graph_timing import Flush, time_graphs

FP8 = torch.float8_e4m3fn
SYSTEMS = ("eager", "batched_mm", "grouped_mm", "deepgemm", "epkit", "patch_moe")
FAMILIES = ("deepseek_v3", "qwen3_moe", "mixtral")
BLOCKS = {"deepseek_v3": "DeepseekV3MoE", "qwen3_moe": "Qwen3MoeSparseMoeBlock", "mixtral": "MixtralSparseMoeBlock"}
BATCHED_MM_MAX_BYTES = 8 << 30  # batched_mm gathers S = tokens * K copies of an expert's weights


def hf_config(family, experts=None):
    import transformers as tf
    if family == "deepseek_v3":
        cfg = tf.DeepseekV3Config(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=experts or 256,
                                  num_experts_per_tok=8, n_group=8, topk_group=4, routed_scaling_factor=2.5,
                                  n_shared_experts=1, norm_topk_prob=True)
    elif family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=experts or 128,
                                num_experts_per_tok=8, norm_topk_prob=True)
    else:
        cfg = tf.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_local_experts=experts or 8,
                               num_experts_per_tok=2)
    cfg._experts_implementation = "eager"
    return cfg


def exact_fp8_(w: torch.Tensor, std: float, g: torch.Generator, chunk: int = 8):
    """Fills w [.., N, K] (bf16) with N(0, std^2) weights rounded to values epkit's quantizer maps
    back exactly: e4m3 codes times power-of-two tile scales, one code per tile at 448 (so the tile's
    amax / 448 is the power of two)."""
    import epkit
    lead = w.shape[:-2] if w.dim() == 3 else (1,)
    w3 = w if w.dim() == 3 else w[None]
    for e0 in range(0, lead[0], chunk):
        part = torch.randn(w3[e0:e0 + chunk].shape, generator=g, device=w.device) * std
        q, s = epkit.quantize_weights(part.to(torch.bfloat16), ue8m0=True)
        q.view(torch.uint8)[..., ::128, ::128] = 0x7E  # e4m3 448
        w3[e0:e0 + chunk] = (q.float() * s.repeat_interleave(128, -2).repeat_interleave(128, -1)).to(torch.bfloat16)


def make_block(family, cfg, seed):
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            block = getattr(mod, BLOCKS[family])(cfg)
    finally:
        torch.set_default_dtype(old)
    block = block.eval()
    g = torch.Generator(device="cuda").manual_seed(seed)
    ex = block.experts
    E, two_i, H = ex.gate_up_proj.shape
    with torch.no_grad():
        exact_fp8_(ex.gate_up_proj.data, 1 / math.sqrt(H), g)
        exact_fp8_(ex.down_proj.data, 1 / math.sqrt(two_i // 2), g)
        block.gate.weight.copy_(torch.randn(E, H, generator=g, device="cuda") * 1.5 / math.sqrt(H))
        if family == "deepseek_v3":
            block.gate.e_score_correction_bias = torch.randn(E, generator=g, device="cuda") * 0.05
            sh = block.shared_experts
            for lin in (sh.gate_proj, sh.up_proj, sh.down_proj):
                exact_fp8_(lin.weight.data, 1 / math.sqrt(lin.weight.shape[1]), g)
    return block


# -- timing ------------------------------------------------------------------------------------

def measure_hbm_read():
    """GB/s of the best torch reduction over 4 GiB (median of 10 each)."""
    n = 4 << 30
    buf = torch.empty(n // 4, dtype=torch.float32, device="cuda").uniform_()
    best = 0.0
    for fn in (lambda: buf.sum(), lambda: buf.amax(), lambda: buf.view(torch.int64).max()):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3)
        best = max(best, n / statistics.median(ts) / 1e9)
    return best


def pick_calls(est_us):
    calls = 20 if est_us < 500 else 10 if est_us < 2000 else 4 if est_us < 20000 else 2
    regions = int(min(30, max(5, 2e6 / max(est_us * calls, 1.0))))
    return calls, regions


def time_eager(flush, fn, inputs, calls, regions):
    us = []
    for _ in range(regions):
        flush.run()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(calls):
            fn(inputs[i % len(inputs)])
        b.record()
        b.synchronize()
        us.append(1000.0 * a.elapsed_time(b) / calls)
    return us


def time_graph(flush, fn, inputs, calls, regions):
    return time_graphs(torch, flush, calls, regions, [lambda i: fn(inputs[i % len(inputs)])], warmup=2)[0]


def stats(us):
    us = sorted(us)
    return dict(us_median=statistics.median(us), us_min=us[0], us_p90=us[min(len(us) - 1, int(0.9 * len(us)))])


# -- bytes -------------------------------------------------------------------------------------

def touched_bytes(block, family, inputs, fp8):
    """Mean bytes of the weights one call reads: its distinct routed experts (from the block's own
    router on that call's input), the shared expert and the router's gate."""
    ex = block.experts
    E, two_i, H = ex.gate_up_proj.shape
    inter = two_i // 2
    per_expert = 3 * H * inter * (1 if fp8 else 2)
    if fp8:
        per_expert += 4 * ((2 * inter // 128) * (H // 128) + (H // 128) * (inter // 128))
    distinct = []
    with torch.no_grad():
        for x in inputs:
            _, _, idx = block.gate(x.view(-1, H))
            distinct.append(int(torch.unique(idx).numel()))
    d = statistics.mean(distinct)
    total = d * per_expert + E * H * 2  # the gate stays bf16 on both sides
    if family == "deepseek_v3":
        Is = block.shared_experts.intermediate_size
        total += 3 * H * Is * (1 if fp8 else 2)
    return total, d


# -- the systems -------------------------------------------------------------------------------

def deepgemm_unavailable():
    try:
        from transformers.integrations.deepgemm import is_deepgemm_loadable
    except Exception as e:  # noqa: BLE001
        return f"transformers has no DeepGEMM integration ({e})"
    try:
        is_deepgemm_loadable(raise_error=True)
    except Exception as e:  # noqa: BLE001
        extra = "" if importlib.util.find_spec("deep_gemm") is None else " (a deep_gemm module is installed, " \
                "but transformers loads DeepGEMM through the kernels hub)"
        return f"{type(e).__name__}: {e}{extra}"
    return None


def run_family(family, args, flush, hbm, rows, agree):
    import epkit.transformers as et
    cfg = hf_config(family, args.deepseek_experts if family == "deepseek_v3" else None)
    t0 = time.time()
    block = make_block(family, cfg, 1234 + FAMILIES.index(family))
    torch.cuda.synchronize()
    E, two_i, H = block.experts.gate_up_proj.shape
    K = cfg.num_experts_per_tok
    print(f"== {family}: {BLOCKS[family]} E={E} K={K} H={H} I={two_i // 2} (built in {time.time() - t0:.1f} s)",
          flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    dg_note = deepgemm_unavailable() if "deepgemm" in systems else None
    patched = None
    g = torch.Generator(device="cuda").manual_seed(99)
    ref_out = {}
    for T in batches:
        inputs = [(torch.randn(1, T, H, generator=g, device="cuda")).to(torch.bfloat16) for _ in range(args.input_sets)]
        b16, distinct = touched_bytes(block, family, inputs, fp8=False)
        b8, _ = touched_bytes(block, family, inputs, fp8=True)
        base = dict(family=family, block=BLOCKS[family], experts=int(E), topk=K, hidden=int(H),
                    intermediate=int(two_i // 2), tokens=T, distinct_experts_mean=distinct)
        for system in systems:
            fp8 = system in ("epkit", "patch_moe")
            wbytes = b8 if fp8 else b16
            floor_us = wbytes / (hbm * 1e9) * 1e6
            row0 = dict(base, system=system, weight_bytes=wbytes, floor_us=floor_us,
                        weights="fp8 e4m3 + 128x128 scales" if fp8 else "bf16")
            note = None
            if system == "deepgemm" and dg_note:
                note = f"skipped: {dg_note}"
            if system == "batched_mm" and T * K * 3 * H * (two_i // 2) * 2 > BATCHED_MM_MAX_BYTES:
                note = f"skipped: batched_mm would gather {T * K * 3 * H * (two_i // 2) * 2 / 2**30:.0f} GiB of weights"
            if note:
                for mode in ("eager", "graph"):
                    rows.append(dict(row0, mode=mode, us_median=None, note=note))
                print(f"  T={T:<5d} {system:11s} {note}", flush=True)
                continue
            try:
                if system == "patch_moe":
                    if patched is None or patched.max_tokens < T:
                        if patched is not None:
                            patched.destroy()
                        patched = et.convert_block(block, max_tokens=max(batches))
                    fn = patched
                else:
                    cfg._experts_implementation = system
                    block.experts.config._experts_implementation = system
                    fn = block

                def call(x, fn=fn):
                    with torch.no_grad():
                        return fn(x)

                with torch.no_grad():
                    out = call(inputs[0])  # warm-up: caches, GEMM objects, DeepGEMM JIT
                torch.cuda.synchronize()
                if system == "eager":
                    ref_out[T] = out.float()
                elif T in ref_out and T == args.agree_tokens:
                    err = float((out.float() - ref_out[T]).norm() / ref_out[T].norm())
                    agree.append(dict(family=family, tokens=T, system=system, rel_err_vs_eager=err))
                t1 = time.perf_counter()
                call(inputs[1 % len(inputs)])
                torch.cuda.synchronize()
                est = (time.perf_counter() - t1) * 1e6
                calls, regions = pick_calls(est)
                if args.quick:
                    regions = max(3, regions // 4)
            except Exception as e:  # noqa: BLE001 - a system that cannot run says so in its rows
                msg = f"failed: {type(e).__name__}: {str(e)[:300]}"
                for mode in ("eager", "graph"):
                    rows.append(dict(row0, mode=mode, us_median=None, note=msg))
                print(f"  T={T:<5d} {system:11s} {msg}", flush=True)
                continue
            for mode, timer in (("eager", time_eager), ("graph", time_graph)):
                if mode == "graph" and system == "eager":  # a failed capture is best not attempted
                    rows.append(dict(row0, mode=mode, us_median=None, note="not capturable: transformers' eager "
                                     "implementation synchronises the host (nonzero over the routing)"))
                    continue
                try:
                    st = stats(timer(flush, call, inputs, calls, regions))
                    r = dict(row0, mode=mode, calls=calls, regions=regions, **st,
                             x_floor=st["us_median"] / floor_us)
                    print(f"  T={T:<5d} {system:11s} {mode:5s} {st['us_median']:10.1f} us  "
                          f"({r['x_floor']:5.2f}x its {row0['weights']} floor {floor_us:8.1f} us)", flush=True)
                except Exception as e:  # noqa: BLE001
                    torch.cuda.synchronize()
                    why = "not capturable" if mode == "graph" else "failed"
                    r = dict(row0, mode=mode, us_median=None, note=f"{why}: {type(e).__name__}: {str(e)[:200]}")
                    print(f"  T={T:<5d} {system:11s} {mode:5s} {r['note'][:110]}", flush=True)
                rows.append(r)
        del inputs
        torch.cuda.empty_cache()
    if patched is not None:
        patched.destroy()
    et.invalidate(block)
    del block, patched
    torch.cuda.empty_cache()


def speedups(rows):
    out = []
    key = lambda r: (r["family"], r["tokens"], r["mode"])  # noqa: E731
    by = {}
    for r in rows:
        if r.get("us_median"):
            by.setdefault(key(r), {})[r["system"]] = r["us_median"]
    for (family, tokens, mode), t in sorted(by.items()):
        base = t.get("grouped_mm")
        s = dict(family=family, tokens=tokens, mode=mode)
        for sysname in ("eager", "batched_mm", "deepgemm", "epkit", "patch_moe"):
            if base and t.get(sysname):
                s[f"{sysname}_speedup_vs_grouped_mm"] = base / t[sysname]
        out.append(s)
    return out


def targets(speed):
    out = []
    for s in speed:
        if s["family"] == "deepseek_v3" and s["tokens"] <= 128:
            for sysname in ("epkit", "patch_moe"):
                v = s.get(f"{sysname}_speedup_vs_grouped_mm")
                if v is not None:
                    out.append(dict(target="DeepSeek-V3 block >= 3x faster than grouped_mm at batch <= 128",
                                    system=sysname, mode=s["mode"], tokens=s["tokens"], speedup=v, met=v >= 3.0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here (e.g. bench/results/transformers-h200-latest.json)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--batches", default="1,8,128,1024")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--deepseek-experts", type=int, default=256, help="routed experts of the DeepSeek-V3 block")
    ap.add_argument("--input-sets", type=int, default=8, help="different inputs (routings) cycled over the calls")
    ap.add_argument("--agree-tokens", type=int, default=128, help="batch at which outputs are compared with eager")
    ap.add_argument("--quick", action="store_true", help="batches 1,128 and fewer timed regions")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("transformers_bench.py: no GPU; nothing to time")
        return 0
    if args.quick and args.batches == "1,8,128,1024":
        args.batches = "1,128"
    try:
        import transformers
        import epkit.transformers  # noqa: F401 - registers "epkit"
    except ImportError as e:
        print(f"transformers_bench.py: {e}")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    prop = torch.cuda.get_device_properties(0)
    flush = Flush(torch, prop.L2_cache_size)
    hbm = measure_hbm_read()
    torch.cuda.empty_cache()  # the 4 GiB read buffer
    print(f"{prop.name}: HBM read {hbm:.0f} GB/s (torch reduction), L2 {prop.L2_cache_size >> 20} MiB", flush=True)
    rows, agree = [], []
    import epkit
    commit = epkit.git_commit  # the commit the extension was built from
    for family in args.families.split(","):
        run_family(family, args, flush, hbm, rows, agree)
    speed = speedups(rows)
    tg = targets(speed)
    print("\n== speedups over transformers' grouped_mm (same mode)")
    for s in speed:
        parts = [f"{k.split('_speedup')[0]} {v:.2f}x" for k, v in s.items() if k.endswith("grouped_mm")]
        print(f"  {s['family']:12s} T={s['tokens']:<5d} {s['mode']:5s} " + ", ".join(parts))
    for a in agree:
        print(f"  agreement {a['family']} T={a['tokens']} {a['system']}: {100 * a['rel_err_vs_eager']:.2f}% vs eager")
    for t in tg:
        print(f"  target {t['system']:9s} {t['mode']:5s} T={t['tokens']:<4d} {t['speedup']:.2f}x -> "
              f"{'met' if t['met'] else 'NOT met'}")
    doc = dict(
        meta=dict(date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), commit=commit,
                  device=prop.name, sms=prop.multi_processor_count, l2_bytes=prop.L2_cache_size,
                  hbm_bytes=prop.total_memory, torch=torch.__version__, transformers=transformers.__version__,
                  cuda_runtime=torch.version.cuda, command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
                  method=("per point and mode: N calls (inputs differing per call) per timed region, the L2 flushed "
                          "(untimed) before every region, CUDA events around it divided by N, median over R regions; "
                          "mode eager = back-to-back Python calls, mode graph = the N calls captured in one CUDA graph "
                          "and replayed. Weights exactly FP8 (power-of-two tile scales), so bf16 and FP8 systems use "
                          "identical weights. floor_us = weight_bytes (distinct routed experts per call from the "
                          "block's own router, + shared expert + gate) / hbm_read_GBps")),
        ceilings=dict(hbm_read_GBps=hbm, hbm_note="best of torch reductions (sum, amax, max) over 4 GiB, median of 10"),
        rows=rows, speedups=speed, targets=tg, agreement=agree)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
