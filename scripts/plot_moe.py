#!/usr/bin/env python3
"""Plots of epkit-moe's JSON (needs matplotlib).

  scripts/plot_moe.py kernels bench/results/moe-h200-latest.json -o docs/img/moe_gemm_h200.png
      grouped GEMM: weight bandwidth against rows per expert (decode regime) and TFLOP/s (large m),
      epkit against torch._scaled_grouped_mm and bf16 torch.bmm, with the measured ceilings.
      DeepGEMM rows whose output disagrees with epkit's (calc_diff > 1e-3) are left out.
  scripts/plot_moe.py configs bench/results/moe-gemm-configs-h100-latest.json -o docs/img/moe_gemm_configs_h100.png
      every compiled grouped-GEMM config of an `epkit-moe kernels --sweep-configs` run at decode sizes:
      weight bytes / time against rows per expert, per shape and group count (the own streaming kernel
      against CUTLASS's swap-AB tiles), with the HBM read ceiling.
  scripts/plot_moe.py layer bench/results/moe-layer-h200-latest.json -o docs/img/moe_layer_h200.png
      the MoE layer: per-kernel breakdown as stacked bars (schedule none) and every schedule's
      graph-replayed latency against batch.
  scripts/plot_moe.py transformers bench/results/transformers-h100-latest.json -o docs/img/transformers_h100.png
      one MoE block per family (transformers_bench.py): graph-replayed time against tokens for
      transformers' grouped_mm, epkit's experts implementation and patch_moe, with each one's
      weight-read floor.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (system, label, colour, the variant's suffix after the shape)
SYSTEMS = [("epkit", "epkit (the heuristic's config)", "C0", ""),
           ("torch_scaled_grouped_mm", "torch._scaled_grouped_mm (row-wise FP8)", "C1", ""),
           ("torch_bmm_bf16", "torch.bmm bf16 (2x weight bytes)", "C2", ""),
           ("deepgemm", "DeepGEMM m_grouped_fp8_gemm_nt_masked", "C3", " masked")]


def decode_axes(ax, ceil, title, title_size=None):
    """An axis of weight bytes / time against rows per expert, with the HBM read ceiling (dotted) and
    the 90% decode target (dashed)."""
    hbm = ceil["hbm_read_GBps"]
    ax.axhline(hbm, color="k", lw=1, ls=":")
    ax.axhline(0.9 * hbm, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, hbm * 1.1)
    ax.set_title(title, fontsize=title_size)
    ax.set_xlabel("rows per expert m")
    ax.set_ylabel("GB/s of weights")


def plot_kernels(doc, out):
    ceil = doc["ceilings"]
    rows = [r for r in doc["rows"] if r["kernel"] == "grouped_gemm" and r.get("us_median")
            and r.get("calc_diff", 0.0) <= 1e-3]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for col, shape in enumerate(["up_gate", "down"]):
        n, k = (4096, 7168) if shape == "up_gate" else (7168, 2048)
        ax_bw, ax_tf = axes[0][col], axes[1][col]
        for G, style in [(32, "-"), (16, "--")]:
            for sysname, label, color, suffix in SYSTEMS:
                pts = sorted((r["m"], r["weight_GBps"], r["TFLOPs"]) for r in rows
                             if r["system"] == sysname and r["variant"] == shape + suffix and r["G"] == G)
                if not pts and sysname == "epkit":  # a DeepGEMM-only run: epkit's rows timed beside DeepGEMM's
                    pts = sorted((r["m"], r["weight_GBps"], r["TFLOPs"]) for r in rows
                                 if r["system"] == "epkit_vs_deepgemm" and r["variant"] == shape + " masked"
                                 and r["G"] == G)
                if not pts:
                    continue
                ms = [p[0] for p in pts]
                ax_bw.plot(ms, [p[1] for p in pts], style, marker="o", ms=3, color=color,
                           label=f"{label}, G={G}")
                ax_tf.plot(ms, [p[2] for p in pts], style, marker="o", ms=3, color=color,
                           label=f"{label}, G={G}")
        decode_axes(ax_bw, ceil, f"{shape} (N {n}, K {k}): weight bytes / time")
        ax_bw.text(1, ceil["hbm_read_GBps"] * 1.01, f"HBM read {ceil['hbm_read_GBps']:.0f} GB/s", fontsize=8)
        ax_bw.text(1, 0.9 * ceil["hbm_read_GBps"] * 1.01, "90% target", fontsize=8, color="grey")
        ax_tf.axhline(ceil["fp8_dense_TFLOPs"], color="k", lw=1, ls=":")
        size = next((w for w in ceil.get("fp8_method", "").replace(",", " ").split() if "^3" in w), "")
        ax_tf.text(1, ceil["fp8_dense_TFLOPs"] * 1.01, f"cuBLASLt FP8 {size} {ceil['fp8_dense_TFLOPs']:.0f} TFLOP/s",
                   fontsize=8)
        ax_tf.axhline(0.8 * ceil["fp8_dense_TFLOPs"], color="grey", lw=0.8, ls="--")
        ax_tf.set_xscale("log", base=2)
        ax_tf.set_ylim(0, ceil["fp8_dense_TFLOPs"] * 1.1)
        ax_tf.set_title(f"{shape}: TFLOP/s")
        ax_tf.set_xlabel("rows per expert m")
        ax_tf.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7, loc="lower right")
    meta = doc.get("meta", {})
    fig.suptitle(f"Grouped FP8 GEMM, DeepSeek-V3 experts, masked layout: {meta.get('device', '')}, "
                 f"commit {meta.get('commit', '?')}, {meta.get('date_utc', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_configs(doc, out):
    ceil = doc["ceilings"]
    rows = [r for r in doc["rows"] if r["kernel"] == "grouped_gemm" and r.get("us_median") and " " in r["variant"]]
    groups = sorted({r["G"] for r in rows})
    configs = [c for c in sorted({r["variant"].split(" ", 1)[1] for r in rows}) if "cooperative" not in c]
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 8), squeeze=False)
    for row, shape in enumerate(["up_gate", "down"]):
        for col, G in enumerate(groups):
            ax = axes[row][col]
            for i, cfg in enumerate(configs):
                pts = sorted((r["m"], r["weight_GBps"]) for r in rows
                             if r["variant"] == f"{shape} {cfg}" and r["G"] == G)
                if pts:
                    own = "stream" in cfg
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if own else "--", marker="o", ms=4,
                            color="C3" if own else f"C{i}", lw=2 if own else 1,
                            label=("own: " if own else "CUTLASS: ") + cfg)
            decode_axes(ax, ceil, f"{shape}, G = {G}", title_size=10)
    axes[0][0].legend(fontsize=7, loc="lower left")
    meta = doc.get("meta", {})
    fig.suptitle(f"Grouped GEMM configs at decode (HBM read {ceil['hbm_read_GBps']:.0f} GB/s dotted, 90% dashed): "
                 f"{meta.get('device', '')}, commit {meta.get('commit', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


STEP_COLORS = {"gate": "C7", "router": "C8", "gate_router": "C7", "quantize": "C9", "dispatch": "C4", "combine": "C6",
               "gemm_w13": "C0", "silu_mul_quantize": "C2", "gemm_w2": "C1", "shared_expert": "C3",
               "add_shared": "C5"}


def plot_layer(doc, out):
    rows = doc["rows"]
    # The layer's default layout: the one every schedule was measured in.
    scheds = {}
    for r in rows:
        scheds.setdefault(r["layout"], set()).add(r["schedule"])
    layout = max(scheds, key=lambda k: (len(scheds[k]), k == "packed"))
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    for col, E in enumerate([256, 32]):
        ax = axes[0][col]
        pts = [r for r in rows if r["experts"] == E and r["schedule"] == "none" and r["layout"] == layout
               and r.get("breakdown")]
        # At <= 32 tokens the layer runs schedule none with the fused gate + router and without it:
        # the bars show the fused one (the default), the A/B is in the JSON.
        best = {}
        for r in pts:
            k = (r["query_len"], r["batch"])
            if k not in best or r.get("gate_router") == "fused":
                best[k] = r
        pts = [best[k] for k in sorted(best)]
        labels = [f"b{r['batch']}\nq{r['query_len']}" for r in pts]
        bottom = [0.0] * len(pts)
        for step in STEP_COLORS:
            vals = [next((s["us_median"] for s in r["breakdown"] if s["step"] == step), 0.0) for r in pts]
            ax.bar(range(len(pts)), vals, bottom=bottom, color=STEP_COLORS[step], label=step)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.plot(range(len(pts)), [r["graph_us_median"] for r in pts], "k_", ms=18, mew=2,
                label="whole layer, graph replay")
        ax.plot(range(len(pts)), [r["weight_bound_us"] for r in pts], "r_", ms=18, mew=2,
                label="touched weights at HBM read ceiling")
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("us per layer")
        ax.set_title(f"E = {E} on one GPU: per-kernel breakdown (schedule none, {layout})")
        if col == 0:
            ax.legend(fontsize=7, ncol=2)
        ax2 = axes[1][col]
        for sched, shared, color in [("none", "concurrent", "C0"), ("none", "in_stream", "C7"),
                                     ("dispatch_overlap", "in_stream", "C1"), ("microbatch", "in_stream", "C3")]:
            for q, style in [(1, "-"), (2, "--")]:
                p = sorted((r["batch"], r["graph_us_median"]) for r in rows if r["experts"] == E and
                           r["schedule"] == sched and r["layout"] == layout and r["query_len"] == q and
                           r.get("shared", "in_stream") == shared)
                if p:
                    name = sched if sched != "none" else f"none, shared {shared}"
                    ax2.plot([x[0] for x in p], [x[1] for x in p], style, marker="o", ms=3, color=color,
                             label=f"{name}, q={q}")
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("batch per rank")
        ax2.set_ylabel("us per layer (graph replay)")
        ax2.set_title(f"E = {E}: schedules at world size 1 (no network to hide)")
        ax2.legend(fontsize=7)
    meta = doc.get("meta", {})
    fig.suptitle(f"MoELayer, DeepSeek-V3 shapes + 1 shared expert, W = 1: {meta.get('device', '')}, "
                 f"commit {meta.get('commit', '?')}, {meta.get('date_utc', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# (system, label, colour, the floor's weights)
TF_SYSTEMS = [("grouped_mm", "transformers grouped_mm (bf16)", "C1"),
              ("epkit", "epkit experts implementation (FP8)", "C0"),
              ("patch_moe", "epkit patch_moe: the whole block (FP8)", "C2")]
TF_FAMILIES = [("deepseek_v3", "DeepSeek-V3 block (E 256, top-8, shared)"),
               ("qwen3_moe", "Qwen3-MoE block (E 128, top-8)"), ("mixtral", "Mixtral block (E 8, top-2)")]


def plot_transformers(doc, out):
    rows = [r for r in doc["rows"] if r["mode"] == "graph" and r.get("us_median")]
    fig, axes = plt.subplots(1, len(TF_FAMILIES), figsize=(15, 4.8))
    for ax, (fam, title) in zip(axes, TF_FAMILIES):
        for sysname, label, color in TF_SYSTEMS:
            pts = sorted((r["tokens"], r["us_median"], r["floor_us"]) for r in rows
                         if r["family"] == fam and r["system"] == sysname)
            if not pts:
                continue
            ts = [p[0] for p in pts]
            ax.plot(ts, [p[1] for p in pts], "-", marker="o", ms=4, color=color, label=label)
            if sysname != "epkit":  # epkit's two share the FP8 floor
                weights = "bf16" if sysname == "grouped_mm" else "FP8"
                ax.plot(ts, [p[2] for p in pts], ":", color=color, lw=1, label=f"{weights} weight-read floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per call")
        ax.set_ylabel("µs per block (CUDA graph)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    meta = doc.get("meta", {})
    fig.suptitle(f"MoE blocks in transformers {meta.get('transformers', '?')}, {meta.get('device', '?')}, "
                 f"commit {meta.get('commit', '?')}, {meta.get('date_utc', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["kernels", "configs", "layer", "transformers"])
    ap.add_argument("json")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    with open(a.json) as f:
        doc = json.load(f)
    {"kernels": plot_kernels, "configs": plot_configs, "layer": plot_layer,
     "transformers": plot_transformers}[a.what](doc, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
