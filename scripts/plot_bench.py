#!/usr/bin/env python3
"""Plot epkit-bench JSON (--json FILE) as latency vs tokens per rank: one panel per (preset, world size),
one line per system (epkit fused calls, epkit graph replay, NCCL, NVSHMEM dense baselines).
Solid lines are medians; the shaded band reaches up to p99.

Usage: scripts/plot_bench.py bench.json [-o bench.png] [--metric total|dispatch|combine]
"""
import argparse
import json
import math
import sys
from collections import defaultdict


def finite(v):
    return isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))


def series(rows, metric):
    """{(preset, world_size): {label: [(tokens, median, p99)]}} from the report's rows."""
    out = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (r["preset"], r["world_size"])
        med, p99 = r.get(f"{metric}_us_median"), r.get(f"{metric}_us_p99")
        # epkit variants (portable path, weights at dispatch) get their own lines.
        name = r["system"]
        if name == "epkit" and r.get("path", "auto") != "auto":
            name = f"epkit ({r['path']})"
        if r["system"] == "epkit" and r.get("layout") == "packed":  # its own line, not a zig-zag with masked
            name += " packed"
        if finite(med):
            out[key][name].append((r["tokens"], med, p99 if finite(p99) else med))
        if r["system"] == "epkit" and metric == "total" and finite(r.get("graph_total_us_median")):
            g99 = r.get("graph_total_us_p99")
            out[key][name + " graph"].append(
                (r["tokens"], r["graph_total_us_median"], g99 if finite(g99) else r["graph_total_us_median"]))
    for panel in out.values():
        for pts in panel.values():
            pts.sort()
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="file written by epkit-bench --json")
    ap.add_argument("-o", "--output", default=None, help="PNG to write (default: JSON name with .png)")
    ap.add_argument("--metric", choices=["total", "dispatch", "combine"], default="total")
    args = ap.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    with open(args.json) as f:
        report = json.load(f)
    data = series(report.get("rows", []), args.metric)
    if not data:
        sys.exit(f"plot_bench.py: no measured '{args.metric}' latencies in {args.json}")

    panels = sorted(data)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    styles = {"epkit": ("C0", "-o"), "epkit graph": ("C0", "--s"), "nccl": ("C1", "-^"), "nvshmem": ("C2", "-v"),
              "epkit packed": ("C4", "-o"), "epkit packed graph": ("C4", "--s"),
              "epkit (auto+weights-at-dispatch)": ("C3", "-o"), "epkit (auto+weights-at-dispatch) graph": ("C3", "--s")}
    for ax, key in zip(axes[0], panels):
        preset, world = key
        where = f"EP{world}" if world > 1 else "world size 1 (local, no link)"
        series_ = sorted(data[key].items())
        tokens = {p[0] for _, pts in series_ for p in pts}
        if len(tokens) == 1:
            # One token count (prefill): a bar per system, the whisker up to p99.
            labels = [label for label, _ in series_]
            med = [pts[0][1] for _, pts in series_]
            p99 = [pts[0][2] for _, pts in series_]
            colors = [styles.get(label, (None, ""))[0] for label in labels]
            ax.bar(range(len(labels)), med, color=colors, alpha=0.8,
                   yerr=[[0] * len(med), [max(0.0, h - m) for m, h in zip(med, p99)]], capsize=3)
            for i, m in enumerate(med):
                ax.text(i, m * 1.05, f"{m:.0f}" if m >= 100 else f"{m:.1f}", ha="center", fontsize=8)
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels([label.replace(" (", "\n(") for label in labels], fontsize=7, rotation=30, ha="right")
            ax.set_title(f"{preset}, {where}, {tokens.pop()} tokens per rank")
            ax.set_ylabel(f"{args.metric} latency, µs (median; whisker to p99)")
            ax.set_yscale("log")
            ax.grid(True, axis="y", which="both", alpha=0.3)
            continue
        for label, pts in series_:
            color, fmt = styles.get(label, (None, "-x"))
            t = [p[0] for p in pts]
            med = [p[1] for p in pts]
            p99 = [p[2] for p in pts]
            ax.plot(t, med, fmt, color=color, label=label)
            ax.fill_between(t, med, p99, color=color, alpha=0.15, linewidth=0)
        ax.set_title(f"{preset}, {where}")
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel(f"{args.metric} latency, µs (median; band to p99)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    meta = report.get("meta", {})
    ceil = report.get("ceilings", {})
    sub = f"{meta.get('gpu', '?')}  commit {meta.get('git_commit', '?')[:10]}  {meta.get('date', '')}"
    if finite(ceil.get("p2p_gbps")):
        sub += f"  P2P {ceil['p2p_gbps']:.0f} GB/s"
    fig.suptitle(f"epkit-bench: {args.metric} dispatch/combine latency\n{sub}", fontsize=10)
    fig.tight_layout()
    out = args.output or (args.json.rsplit(".", 1)[0] + ".png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
