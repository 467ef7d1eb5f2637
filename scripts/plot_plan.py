#!/usr/bin/env python3
"""Plots for docs/PLANNER.md from epkit-plan's JSON output.

  epkit-plan sweep --json > sweep.json
  epkit-plan roofline --json > roofline.json
  scripts/plot_plan.py --sweep sweep.json --roofline roofline.json --out docs/img

Writes plan_pareto.png (throughput per node, log scale, against output speed per request, one Pareto
frontier per EP, like the published DeepSeek-V3 deployment study's figure) and plan_roofline.png (GEMM and GroupGEMM points of one MoE layer
on the H100 and H200 rooflines).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display on build machines
import matplotlib.pyplot as plt  # noqa: E402


def plot_pareto(sweep, path):
    points = sweep["points"]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (key, idx) in enumerate(sweep["pareto"].items()):
        if not idx:
            continue
        ep = int(key[2:])
        front = [points[i] for i in idx]
        color = colors[n % len(colors)]
        # All feasible points of this EP, faint, so the frontier's support is visible.
        allp = [p for p in points if p["config"]["ep"] == ep and p["fits"]]
        ax.scatter([p["output_tokens_per_s_per_request"] for p in allp],
                   [p["throughput_tokens_per_s_per_node"] for p in allp], s=6, color=color, alpha=0.25)
        gpu = front[0]["gpu"]
        nodes = front[0]["config"]["nodes"]
        ax.plot([p["output_tokens_per_s_per_request"] for p in front],
                [p["throughput_tokens_per_s_per_node"] for p in front], "-o", ms=3.5, color=color,
                label=f"EP{ep} ({nodes}x8 {gpu})")
    ax.axvspan(40, 80, color="grey", alpha=0.08, lw=0)
    ax.set_yscale("log")
    ax.set_xlabel("output speed per request (tokens/s)")
    ax.set_ylabel("throughput per node (tokens/s, log)")
    model = sweep["model"]["name"]
    ax.set_title(f"{model}: Pareto frontier per EP (model, query length 2, 60% acceptance, KV 5000)")
    ax.title.set_fontsize(10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_roofline(roof, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    classes = {"gemm": ("GEMM", "s"), "group_gemm": ("GroupGEMM", "o")}
    for ax, kind in zip(axes, ["gemm", "group_gemm"]):
        xs = [p["intensity_flop_per_byte"] for p in roof["points"] if p["class"] == kind]
        lo, hi = max(min(xs) / 2, 0.5), max(xs) * 4
        for n, r in enumerate(roof["rooflines"]):
            grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            ax.plot(grid, [min(r["peak_fp8_tflops"], x * r["hbm_bandwidth_tb_per_s"]) for x in grid],
                    lw=1.2, color="k", ls=["-", "--", ":", "-."][n % 4], label=f'{r["gpu"]} FP8 roofline')
        all_eps = sorted({p["ep"] for p in roof["points"]})
        cmap = plt.get_cmap("viridis")
        for r in roof["rooflines"]:
            pts = [p for p in roof["points"] if p["class"] == kind and p["gpu"] == r["gpu"]]
            eps = sorted({p["ep"] for p in pts})
            marker = "o" if r["gpu"].startswith("h100") else "^"
            for ep in eps:
                sel = [p for p in pts if p["ep"] == ep]
                color = cmap(all_eps.index(ep) / max(1, len(all_eps) - 1))
                ax.scatter([p["intensity_flop_per_byte"] for p in sel], [p["tflops"] for p in sel], s=12,
                           marker=marker, color=color, alpha=0.75, label=f'{r["gpu"]} EP{ep}')
                # Stars: batch 128 per GPU, as in the published study's GroupGEMM figure.
                star = [p for p in sel if p["batch"] == 128]
                ax.scatter([p["intensity_flop_per_byte"] for p in star], [p["tflops"] for p in star], s=70,
                           marker="*", color=color, edgecolor="k", lw=0.4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_title(f"{classes[kind][0]} (modelled, batch 1-128 per GPU, TP1)")
        ax.title.set_fontsize(10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, help="epkit-plan sweep --json output")
    ap.add_argument("--roofline", required=True, help="epkit-plan roofline --json output")
    ap.add_argument("--out", default="docs/img", help="output folder")
    args = ap.parse_args()
    with open(args.sweep) as f:
        sweep = json.load(f)
    with open(args.roofline) as f:
        roof = json.load(f)
    for key in ("points", "pareto", "model"):
        if key not in sweep:
            sys.exit(f"plot_plan.py: {args.sweep} has no '{key}': is it `epkit-plan sweep --json` output?")
    if "rooflines" not in roof or "points" not in roof:
        sys.exit(f"plot_plan.py: {args.roofline} is not `epkit-plan roofline --json` output")
    os.makedirs(args.out, exist_ok=True)
    plot_pareto(sweep, os.path.join(args.out, "plan_pareto.png"))
    plot_roofline(roof, os.path.join(args.out, "plan_roofline.png"))
    print(f"wrote {args.out}/plan_pareto.png and {args.out}/plan_roofline.png")


if __name__ == "__main__":
    main()
