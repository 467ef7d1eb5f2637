#!/usr/bin/env python3
"""DeepGEMM's grouped FP8 GEMMs against epkit's, in one process, on the same operands, into epkit-moe's JSON.

What vLLM and SGLang run for DeepSeek-V3's experts on Hopper is DeepGEMM:
`m_grouped_fp8_gemm_nt_masked` over the masked layout at decode and
`m_grouped_fp8_gemm_nt_contiguous` at prefill. This script times both against epkit.grouped_gemm
with epkit-moe's method and writes rows of system "deepgemm" (and "epkit_vs_deepgemm": epkit timed
by this script, interleaved with DeepGEMM) into FILE, next to the rows of `epkit-moe kernels` (a
point measured again replaces its rows; other points' rows stay):

  masked      both DeepSeek-V3 shapes, G in --groups, m in --m; even counts (every group m rows,
              capacity m) and uneven counts (epkit-moe's generator: G/4 groups empty, the others
              about 2m/3 and 2m rows, G m rows in all, capacity 2m). DeepGEMM gets the very tensors
              epkit takes, the activation scales made MN-major and TMA-aligned once, outside the
              timing (get_mn_major_tma_aligned_tensor), and expected_m = m, the hint epkit gets.
  contiguous  G = 8 with m in --contiguous-m, and G = 32 with m in --contiguous-g32-m: the rows of
              all groups back to back (epkit's packed layout with offsets; DeepGEMM's m_indices,
              group id per row). Even counts are the same memory for both. Uneven counts: epkit
              reads them back to back, DeepGEMM the same rows with each group padded to its
              M alignment (128 on SM90) and -1 in m_indices on the padding rows.

Each row records DeepGEMM's output against epkit's on the rows that exist, in DeepGEMM's
calc_diff (1 - 2 sum(x y) / sum(x^2 + y^2), float64), the largest |x - y|, the fraction of
identical bf16 outputs, and epkit_over_deepgemm = epkit time / DeepGEMM time from the same
interleaved replays.

Method: epkit-moe's (graph_timing.py): one CUDA graph per system, the two systems' replays
alternating (ABAB, then BABA) so that both see the same clocks; median and p99 over replays; inputs
rotated over sets that together exceed 4x the L2.

DeepGEMM (pinned: tokenspeed-deepgemm==2.5.0.post20260424, built for CUDA 13, imports with torch
2.11) compiles its kernels at the first call (nvcc at run time). --jit-workers N compiles them first
in N processes at once (into DG_JIT_CACHE_DIR, which --jit-cache sets), so that the timed process
only loads them. Without deep_gemm this script says why and exits 0; without epkit (PYTHONPATH
build/python) it times DeepGEMM alone.

  build/bin/epkit-moe kernels --kernels grouped_gemm --groups 8,16,32 --m 1,8,32,64,128 --json F
  PYTHONPATH=build/python python3 tools/epkit-moe/deepgemm_baseline.py F --jit-workers 12
"""
import argparse
import json
import os
import statistics
import sys
import time

from graph_timing import Flush, finish, p99, pick_repeats, rotation_sets, time_graphs

DEEPGEMM_PIN = "tokenspeed-deepgemm==2.5.0.post20260424"
SYSTEMS = ("deepgemm", "epkit_vs_deepgemm")
SHAPES = {"up_gate": (4096, 7168), "down": (7168, 2048)}  # name: (N, K), DeepSeek-V3 (I 2048, H 7168)


# ---- pure helpers (no torch: the CPU tests import them) ------------------------------------------

def uneven_counts(G, m):
    """epkit-moe's uneven per-group rows (tools/epkit-moe/bench_core.cpp, uneven_counts): G * m in all,
    G / 4 groups empty, the others alternating about 2m/3 and 2m, none above 2m."""
    h = [0] * G
    active = G - G // 4
    total = 0
    for g in range(active):
        h[g] = 2 * m if g % 2 else (2 * m) // 3
        total += h[g]
    g = 0
    while total != G * m:
        step = 1 if total < G * m else -1
        if (step > 0 and h[g] < 2 * m) or (step < 0 and h[g] > 0):
            h[g] += step
            total += step
        g = (g + 2) % max(active, 1)
    return h


AGREE_CALC_DIFF = 1e-3  # DeepGEMM's own tests accept calc_diff < 1e-3 for FP8 GEMMs


def align(x, a):
    return (x + a - 1) // a * a


def weight_bytes(G, n, k, active=None):
    """fp8 weights + fp32 128x128 scales of the groups that have rows (the groups whose weights must be read)."""
    per = n * k + ((n + 127) // 128) * ((k + 127) // 128) * 4
    return float(per * (G if active is None else active))


def cases(args):
    """Every point to time, in order: dicts of kind, shape, n, k, G, m, counts ("even"/"uneven")."""
    out = []
    for name in args.shapes:
        n, k = SHAPES[name]
        if "masked" in args.layouts:
            for G in args.groups:
                for m in args.m:
                    out.append(dict(kind="masked", shape=name, n=n, k=k, G=G, m=m, counts="even"))
                    if G >= 4 and m >= 3:  # epkit-moe's rule for its uneven case
                        out.append(dict(kind="masked", shape=name, n=n, k=k, G=G, m=m, counts="uneven"))
        if "contiguous" in args.layouts:
            for G, ms in ((8, args.contiguous_m), (32, args.contiguous_g32_m)):
                for m in ms:
                    for c in ("even", "uneven"):
                        out.append(dict(kind="contiguous", shape=name, n=n, k=k, G=G, m=m, counts=c))
    return out


def case_counts(c):
    return [c["m"]] * c["G"] if c["counts"] == "even" else uneven_counts(c["G"], c["m"])


def variant(c):
    return f'{c["shape"]} {c["kind"]}' + (" uneven" if c["counts"] == "uneven" else "")


# ---- GPU part ------------------------------------------------------------------------------------

def import_deep_gemm():
    try:
        import deep_gemm  # noqa: F401
        return deep_gemm, None
    except Exception as e:  # ImportError, or a torch ABI / CUDA mismatch raised at import
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def import_epkit():
    try:
        import epkit  # noqa: F401
        return epkit, None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e)[:300]}"


class Operands:
    """One case's operands, `sets` times over: a, a_scale (K-major, epkit's), sfa (the same values
    MN-major and TMA-aligned, DeepGEMM's), b, b_scale, and one output per system and set."""

    def __init__(self, torch, dg, c, sets, with_epkit):
        G, n, k, m = c["G"], c["n"], c["k"], c["m"]
        FP8 = torch.float8_e4m3fn
        counts = case_counts(c)
        self.counts_host = counts
        self.counts = torch.tensor(counts, dtype=torch.int32, device="cuda")
        self.active = sum(1 for x in counts if x > 0)
        self.sets = sets
        kb = k // 128
        nb = (n + 127) // 128
        if c["kind"] == "masked":
            # The capacity rounded up to 64 rows: DeepGEMM's masked kernel reads its rows in blocks
            # of 64 and computes wrong rows below that (measured: calc_diff 0.19-1.0 at capacity
            # 1-32); engines size it num_max_dispatch_tokens_per_rank x ranks, a multiple of 64.
            cap = align(m if c["counts"] == "even" else 2 * m, 64)
            self.rows = cap
            a_shape, s_shape, d_shape = (G, cap, k), (G, cap, kb), (G, cap, n)
        else:
            rows = G * m  # back to back: epkit's packed layout, and DeepGEMM's when every count is aligned
            self.rows = rows
            a_shape, s_shape, d_shape = (rows, k), (rows, kb), (rows, n)
            off = [0]
            for x in counts:
                off.append(off[-1] + x)
            self.offsets_host = off
            self.offsets = torch.tensor(off, dtype=torch.int32, device="cuda")
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1000 + G * 131 + m * 7 + n)

        def fp8(shape):
            return torch.empty(shape, device="cuda").uniform_(-2.0, 2.0, generator=gen).to(FP8)

        def scales(shape):
            return torch.empty(shape, device="cuda").uniform_(0.01, 0.02, generator=gen)

        self.a = [fp8(a_shape) for _ in range(sets)]
        self.a_scale = [scales(s_shape) for _ in range(sets)]
        self.b = [fp8((G, n, k)) for _ in range(sets)]
        self.b_scale = [scales((G, nb, kb)) for _ in range(sets)]
        self.d_dg = [torch.zeros(d_shape, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
        self.d_ep = [torch.zeros(d_shape, dtype=torch.bfloat16, device="cuda") for _ in range(sets)] if with_epkit else None
        # DeepGEMM's operands.
        if c["kind"] == "masked" or c["counts"] == "even":
            self.a_dg = self.a
            self.sfa = [dg.get_mn_major_tma_aligned_tensor(s) for s in self.a_scale]
            self.d_dg_rows = None
            if c["kind"] == "contiguous":
                self.m_indices = torch.arange(G, dtype=torch.int32, device="cuda").repeat_interleave(m)
        else:
            # Uneven contiguous: each group padded to DeepGEMM's M alignment, -1 on the padding rows.
            al = dg.get_mk_alignment_for_contiguous_layout()
            starts, pos = [], 0
            for x in counts:
                starts.append(pos)
                pos += align(x, al)
            total = max(pos, al)
            idx = torch.full((total,), -1, dtype=torch.int32)
            src_rows, dst_rows = [], []
            for g, x in enumerate(counts):
                idx[starts[g]:starts[g] + x] = g
                src_rows.extend(range(off[g], off[g] + x))
                dst_rows.extend(range(starts[g], starts[g] + x))
            self.m_indices = idx.to("cuda")
            src = torch.tensor(src_rows, dtype=torch.long, device="cuda")
            dst = torch.tensor(dst_rows, dtype=torch.long, device="cuda")
            self.a_dg, self.sfa = [], []
            for s in range(sets):
                ap = torch.zeros((total, k), dtype=FP8, device="cuda")
                ap.view(torch.uint8)[dst] = self.a[s].view(torch.uint8)[src]
                sp = torch.zeros((total, kb), device="cuda")
                sp[dst] = self.a_scale[s][src]
                self.a_dg.append(ap)
                self.sfa.append(dg.get_mn_major_tma_aligned_tensor(sp))
            self.d_dg = [torch.zeros((total, n), dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
            self.d_dg_rows = (src, dst)

    def valid(self, c, d_ep, d_dg):
        """(epkit rows, DeepGEMM rows) that exist, flattened in the same order."""
        torch = sys.modules["torch"]
        if c["kind"] == "masked":
            cap = self.rows
            mask = torch.arange(cap, device="cuda")[None, :] < self.counts[:, None]
            return d_ep[mask], d_dg[mask]
        total = sum(self.counts_host)
        if self.d_dg_rows is None:
            return d_ep[:total], d_dg[:total]
        src, dst = self.d_dg_rows
        return d_ep[src], d_dg[dst]


def calc_diff(x, y):
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if float(denom) == 0.0:
        return 0.0
    return float(1.0 - 2.0 * (x * y).sum() / denom)


def dg_call(dg, c, ops, set_idx):
    i = set_idx % ops.sets
    if c["kind"] == "masked":
        dg.m_grouped_fp8_gemm_nt_masked((ops.a_dg[i], ops.sfa[i]), (ops.b[i], ops.b_scale[i]), ops.d_dg[i],
                                        ops.counts, c["m"])
    else:
        dg.m_grouped_fp8_gemm_nt_contiguous((ops.a_dg[i], ops.sfa[i]), (ops.b[i], ops.b_scale[i]), ops.d_dg[i],
                                            ops.m_indices)


def jit_worker(spec):
    """Compiles (or loads) DeepGEMM's kernels of some cases: one call each on operands of the timed shapes."""
    case_list, cache = spec
    if cache:
        os.environ["DG_JIT_CACHE_DIR"] = cache
    import torch
    dg, why = import_deep_gemm()
    if dg is None:
        return f"deep_gemm: {why}"
    t0 = time.time()
    for c in case_list:
        ops = Operands(torch, dg, c, 1, False)
        dg_call(dg, c, ops, 0)
        torch.cuda.synchronize()
        del ops
    return f"{len(case_list)} cases in {time.time() - t0:.0f} s"


def prewarm_jit(all_cases, workers, cache):
    import multiprocessing as mp
    # One case per distinct DeepGEMM problem (the kernel depends on shape, groups, rows and expected_m).
    seen, todo = set(), []
    for c in all_cases:
        key = (c["kind"], c["n"], c["k"], c["G"], c["m"], c["counts"])
        if key not in seen:
            seen.add(key)
            todo.append(c)
    chunks = [todo[i::workers] for i in range(workers)]
    chunks = [(ch, cache) for ch in chunks if ch]
    t0 = time.time()
    print(f"compiling DeepGEMM's kernels for {len(todo)} problems in {len(chunks)} processes ...", flush=True)
    with mp.get_context("spawn").Pool(len(chunks)) as pool:
        for r in pool.imap_unordered(jit_worker, chunks):
            print(f"  jit worker: {r}", flush=True)
    print(f"  done in {time.time() - t0:.0f} s", flush=True)


def write(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", help="epkit-moe kernels' JSON (read for the ceilings, rewritten with these rows)")
    ap.add_argument("--shapes", default="up_gate,down")
    ap.add_argument("--layouts", default="masked,contiguous")
    ap.add_argument("--groups", default="8,16,32")
    ap.add_argument("--m", default="1,8,32,64,128")
    ap.add_argument("--contiguous-m", default="512,1024,2048,4096", help="rows per group of the G = 8 contiguous cases")
    ap.add_argument("--contiguous-g32-m", default="512", help="rows per group of the G = 32 contiguous cases")
    ap.add_argument("--jit-workers", type=int, default=0, help="compile DeepGEMM's kernels first in N processes")
    ap.add_argument("--jit-cache", default="", help="DG_JIT_CACHE_DIR for this run (default: DeepGEMM's, ~/.deep_gemm)")
    ap.add_argument("--no-epkit", action="store_true", help="time DeepGEMM alone")
    ap.add_argument("--epkit-configs", default="",
                    help="more epkit grouped-GEMM configs to time in the same graphs (comma list of compiled names); "
                         "each lands in the DeepGEMM row's epkit_configs, the heuristic's choice stays the epkit row")
    ap.add_argument("--uneven-counts", metavar="G,m[/G,m...]",
                    help="print the uneven counts of each (G, m), one line each, and exit (CPU tests)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args()
    if args.uneven_counts:
        for pair in args.uneven_counts.split("/"):
            G, m = (int(x) for x in pair.split(","))
            print(" ".join(str(x) for x in uneven_counts(G, m)))
        return 0
    args.shapes = [s for s in args.shapes.split(",") if s]
    for s in args.shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: '{s}' is not one of {', '.join(SHAPES)}")
    args.layouts = [s for s in args.layouts.split(",") if s]
    args.groups = [int(x) for x in args.groups.split(",") if x]
    args.m = [int(x) for x in args.m.split(",") if x and int(x) > 0]
    args.contiguous_m = [int(x) for x in args.contiguous_m.split(",") if x]
    args.contiguous_g32_m = [int(x) for x in args.contiguous_g32_m.split(",") if x]
    extra_configs = [x for x in args.epkit_configs.split(",") if x]
    all_cases = cases(args)
    if args.list:
        for c in all_cases:
            print(c["kind"], c["shape"], "G", c["G"], "m", c["m"], c["counts"], case_counts(c))
        return 0
    if not args.json:
        ap.error("the JSON file of epkit-moe kernels is needed")
    if args.jit_cache:
        os.environ["DG_JIT_CACHE_DIR"] = os.path.abspath(args.jit_cache)

    import torch
    if not torch.cuda.is_available():
        print("deepgemm_baseline.py: no GPU; nothing to time")
        return 0
    with open(args.json) as f:
        doc = json.load(f)
    meta = doc.setdefault("meta", {})
    dg, why = import_deep_gemm()
    if dg is None:
        msg = f"skipped: deep_gemm does not import ({why}); install the pinned wheel {DEEPGEMM_PIN}"
        print(f"deepgemm_baseline.py: {msg}")
        meta["deepgemm"] = msg
        write(args.json, doc)
        return 0
    ep, ep_why = (None, "--no-epkit") if args.no_epkit else import_epkit()
    if ep is None:
        print(f"deepgemm_baseline.py: epkit does not import ({ep_why}): timing DeepGEMM alone, no ratios")
    ceil = doc.get("ceilings", {})
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = Flush(torch, l2)

    meta["deepgemm"] = dict(package=DEEPGEMM_PIN, version=getattr(dg, "__version__", "?"), num_sms=dg.get_num_sms(),
                            mk_alignment=dg.get_mk_alignment_for_contiguous_layout(),
                            epkit=("timed in the same process, interleaved" if ep is not None else f"not timed: {ep_why}"),
                            command=" ".join(["tools/epkit-moe/deepgemm_baseline.py"] + sys.argv[1:]))
    meta.setdefault("torch", torch.__version__)
    if args.jit_workers > 0:
        prewarm_jit(all_cases, args.jit_workers, os.environ.get("DG_JIT_CACHE_DIR", ""))

    rows = []
    # This run's points replace the same points of an earlier run of this script (a run split over
    # calls, --layouts masked then contiguous, adds up); every other row is kept.
    keys = {(variant(c), c["G"], c["m"]) for c in all_cases}
    doc["rows"] = [r for r in doc.get("rows", [])
                   if r.get("system") not in SYSTEMS or (r.get("variant"), r.get("G"), r.get("m")) not in keys]
    base_rows = list(doc["rows"])
    summary = []
    for c in all_cases:
        G, n, k, m = c["G"], c["n"], c["k"], c["m"]
        counts = case_counts(c)
        active = sum(1 for x in counts if x > 0)
        real = sum(counts)
        wb = weight_bytes(G, n, k, active)
        rows_cap = align(m if c["counts"] == "even" else 2 * m, 64) if c["kind"] == "masked" else real
        per_call = weight_bytes(G, n, k) + G * rows_cap * k + G * rows_cap * n * 2 if c["kind"] == "masked" \
            else weight_bytes(G, n, k) + real * (k + 2 * n)
        sets = rotation_sets(per_call, l2, 20)
        flops = 2.0 * real * n * k
        base = dict(kernel="grouped_gemm", variant=variant(c), G=G, m=m, N=n, K=k,
                    bytes=wb + real * (k + 2 * n), weight_bytes=wb, flops=flops)
        label = f'{variant(c):26s} G={G:<3d} m={m:<5d}'
        try:
            ops = Operands(torch, dg, c, sets, ep is not None)
            fns = [lambda i, ops=ops, c=c: dg_call(dg, c, ops, i)]
            gemm = None
            gemms = []  # the heuristic's config first, then --epkit-configs (the same output buffers)
            if ep is not None:
                layout = "masked" if c["kind"] == "masked" else "packed"
                for cfg in [None] + [x for x in extra_configs]:
                    g_ = ep.GroupedGemm(G, n, k, ops.rows, layout=layout, expected_m=m, config=cfg)
                    if cfg is not None and g_.config == gemms[0].config:
                        continue
                    gemms.append(g_)
                    offsets = () if layout == "masked" else (ops.offsets,)
                    fns.append(lambda i, ops=ops, g=g_, o=offsets: g.run(ops.a[i % ops.sets], ops.a_scale[i % ops.sets],
                                                                         ops.b[i % ops.sets], ops.b_scale[i % ops.sets],
                                                                         ops.counts, *o, out=ops.d_ep[i % ops.sets]))
                gemm = gemms[0]
            # Agreement first, on set 0, from one call of each (each epkit config on a poisoned output).
            diffs = []
            dg_call(dg, c, ops, 0)
            for fn in fns[1:]:
                ops.d_ep[0].fill_(float("nan"))
                fn(0)
                torch.cuda.synchronize()
                x, y = ops.valid(c, ops.d_ep[0], ops.d_dg[0])
                diffs.append(dict(calc_diff=calc_diff(x, y),
                                  max_abs_diff=float((x.float() - y.float()).abs().max()) if x.numel() else 0.0,
                                  identical_fraction=float((x.view(torch.int16) == y.view(torch.int16)).float().mean())
                                  if x.numel() else 1.0))
            diff = diffs[0] if diffs else {}
            est = max(base["bytes"] / 3e6, flops / 8e8) + 5  # epkit-moe's estimate: the same repeat counts
            calls, replays = pick_repeats(est)
            t = [(statistics.median(us), p99(us)) for us in time_graphs(torch, flush, calls, replays, fns)]
        except Exception as e:
            r = dict(base, system="deepgemm", us_median=None, note=f"failed: {type(e).__name__}: {str(e)[:300]}")
            rows.append(r)
            print(f"  {label} {r['note']}", flush=True)
            torch.cuda.empty_cache()
            continue
        note = f"{real} real rows over {active} groups"
        r = finish(dict(base, system="deepgemm", us_median=t[0][0], us_p99=t[0][1], calls=calls, replays=replays,
                        note=note + (", expected_m = m" if c["kind"] == "masked" else ", m_indices")), ceil)
        r.update(diff)
        # A ratio only where the two computed the same thing (identical bits in every run so far).
        if diff:
            r["outputs_agree"] = diff["calc_diff"] <= AGREE_CALC_DIFF
        if ep is not None:
            e = finish(dict(base, system="epkit_vs_deepgemm", us_median=t[1][0], us_p99=t[1][1], calls=calls,
                            replays=replays, note=note + "; " + gemm.config), ceil)
            e.update(diff)
            r["epkit_us_median"] = e["us_median"]
            r["epkit_config"] = gemm.config
            r["epkit_over_deepgemm"] = e["us_median"] / r["us_median"]
            e["deepgemm_us_median"] = r["us_median"]
            e["epkit_over_deepgemm"] = r["epkit_over_deepgemm"]
            rows.append(e)
            if len(gemms) > 1:
                r["epkit_configs"] = {g_.config: dict(us_median=t[j + 1][0], over_deepgemm=t[j + 1][0] / r["us_median"],
                                                      **diffs[j])
                                      for j, g_ in enumerate(gemms)}
        rows.append(r)
        summary.append(r)
        ratio = f'{r["epkit_over_deepgemm"]:6.3f}' if "epkit_over_deepgemm" in r else "   n/a"
        ep_us = f'{r["epkit_us_median"]:9.2f}' if "epkit_us_median" in r else "      n/a"
        cd = f'{r["calc_diff"]:.2e}' if "calc_diff" in r else "n/a"
        print(f"  {label} deepgemm {r['us_median']:9.2f} us ({r['pct_of_ceiling']:5.1f}% of {r['bound']})  "
              f"epkit {ep_us} us  epkit/deepgemm {ratio}  calc_diff {cd}", flush=True)
        for name, v in r.get("epkit_configs", {}).items():
            print(f"  {label}   epkit {name:34s} {v['us_median']:9.2f} us  /deepgemm {v['over_deepgemm']:6.3f}  "
                  f"calc_diff {v['calc_diff']:.2e}", flush=True)
        doc["rows"] = base_rows + rows
        write(args.json, doc)  # a checkpoint after every point: a run cut short keeps what it measured
        del ops, fns, gemm
        torch.cuda.empty_cache()
    doc["rows"] = base_rows + rows
    write(args.json, doc)
    print(f"wrote {len(rows)} rows into {args.json}")
    if summary and ep is not None:
        worst = max(summary, key=lambda r: r.get("calc_diff", 0.0))
        disagree = [r for r in summary if not r.get("outputs_agree", True)]
        summary = [r for r in summary if r.get("outputs_agree", True)] or summary
        if disagree:
            print(f"outputs disagree (calc_diff > {AGREE_CALC_DIFF:g}) at {len(disagree)} points, left out of the ratios: "
                  + ", ".join(f"{r['variant']} G={r['G']} m={r['m']}" for r in disagree))
        ratios = [r["epkit_over_deepgemm"] for r in summary]
        print(f"epkit / deepgemm: {min(ratios):.3f} .. {max(ratios):.3f} over {len(ratios)} points; "
              f"largest calc_diff {worst.get('calc_diff', 0.0):.2e} ({worst['variant']} G={worst['G']} m={worst['m']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
