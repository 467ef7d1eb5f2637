#!/usr/bin/env python3
"""Plot an A/B folder of epkit-bench JSON (scripts/bench-ab.sh run / run-libs: <tree>-<round>.json)
as grouped bars: one group per (preset, tokens, layout), one bar per tree (median over rounds of the
event-timed dispatch + combine), a marker for each tree's graph figure, and optional targets.

Usage: scripts/plot_ab.py AB_DIR -o out.png [--trees old,tip] [--labels "before,after"]
       [--layout masked] [--path auto] [--target decode:1=12 ...] [--floor US] [--title TEXT] [--tokens 1,128]
"""
import argparse
import glob
import json
import os
import statistics
import sys
from collections import defaultdict


def load(ab_dir, trees, layout, path="auto"):
    """{tree: {(preset, tokens): (total median, graph median)}} over the rounds of each tree."""
    out = {}
    for t in trees:
        files = sorted(glob.glob(os.path.join(ab_dir, f"{t}-*.json")))
        if not files:
            sys.exit(f"no {t}-<round>.json in {ab_dir}")
        acc = defaultdict(lambda: ([], []))
        for f in files:
            for r in json.load(open(f))["rows"]:
                if r["system"] != "epkit" or r.get("layout", "masked") != layout or r.get("path", "auto") != path:
                    continue
                tot, gr = acc[(r["preset"], r["tokens"])]
                tot.append(r["total_us_median"])
                if r.get("graph_total_us_median") is not None:
                    gr.append(r["graph_total_us_median"])
        out[t] = {k: (statistics.median(v[0]), statistics.median(v[1]) if v[1] else None) for k, v in acc.items()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ab_dir")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--trees", default="old,tip")
    ap.add_argument("--labels", default=None, help="one per tree, comma-separated")
    ap.add_argument("--layout", default="masked")
    ap.add_argument("--path", default="auto", help='the rows\' path field, e.g. "auto+device-m" (--device-m runs)')
    ap.add_argument("--target", action="append", default=[], help="preset:tokens=us")
    ap.add_argument("--floor", type=float, default=None, help="harness floor of the two timed calls (us)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--tokens", default=None, help="only these token counts, comma-separated (e.g. leave prefill out)")
    a = ap.parse_args()
    trees = a.trees.split(",")
    labels = a.labels.split(",") if a.labels else trees
    if len(labels) != len(trees):
        sys.exit("--labels needs one label per tree")
    data = load(a.ab_dir, trees, a.layout, a.path)
    cases = sorted(set.intersection(*(set(d) for d in data.values())), key=lambda k: (k[0], k[1]))
    if not cases:
        sys.exit(f"no rows with path '{a.path}' and layout '{a.layout}' common to {', '.join(trees)}")
    if a.tokens:
        keep = {int(t) for t in a.tokens.split(",")}
        cases = [c for c in cases if c[1] in keep]
    targets = {}
    for s in a.target:
        key, us = s.split("=")
        preset, tok = key.split(":")
        targets[(preset, int(tok))] = float(us)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.9 * len(cases) + 4.5, 4.2))
    width = 0.8 / len(trees)
    for i, (t, lab) in enumerate(zip(trees, labels)):
        xs = [c + (i - (len(trees) - 1) / 2) * width for c in range(len(cases))]
        tot = [data[t][k][0] for k in cases]
        bars = ax.bar(xs, tot, width * 0.95, label=f"{lab}: event-timed pair")
        for x, v in zip(xs, tot):
            ax.text(x, v + 0.2, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        gr = [data[t][k][1] for k in cases]
        ax.plot(xs, gr, "v", color=bars.patches[0].get_facecolor(), markeredgecolor="black",
                label=f"{lab}: graph replay")
    for c, k in enumerate(cases):
        if k in targets:
            ax.hlines(targets[k], c - 0.45, c + 0.45, colors="red", linestyles="--",
                      label="target" if c == min(j for j, kk in enumerate(cases) if kk in targets) else None)
    if a.floor is not None:
        ax.axhline(a.floor, color="gray", linestyle=":", label=f"harness floor, two calls ({a.floor:.1f} us)")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{p}\n{n} token{'s' if n != 1 else ''}" for p, n in cases])
    ax.set_ylabel("dispatch + combine (us, median)")
    ax.set_title(a.title or f"{a.ab_dir} ({a.layout})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_ylim(0, max(data[t][c][0] for t in trees for c in cases) * 1.25)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
