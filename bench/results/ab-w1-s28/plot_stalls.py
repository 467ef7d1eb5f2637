#!/usr/bin/env python3
"""Stacked bars of ncu's warp states (cycles per issued instruction) per profiled launch, from the
`--page details --print-details all` text of session 28's calls; also prints the table.

  plot_stalls.py OUT.png LABEL=DETAILS.txt[.xz][:LAUNCHES] ...   (LAUNCHES: comma list, 1-based)
"""
import lzma
import re
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

KEEP = ["Stall Barrier", "Stall Long Scoreboard", "Stall Short Scoreboard", "Stall IMC Miss", "Stall No Instruction",
        "Stall Wait", "Stall Branch Resolving", "Selected", "Stall Not Selected"]


def launches(path):
    out, cur = [], None
    f = lzma.open(path, "rt", encoding="utf-8") if path.endswith(".xz") else open(path, encoding="utf-8")
    for line in f:
        m = re.match(r"\s+void .*?::(\w+)<", line)
        if m:
            cur = {"kernel": m.group(1), "states": {}}
            out.append(cur)
            continue
        if cur is None:
            continue
        m = re.match(r"\s+(Stall [A-Za-z ]+?|Selected)\s+inst\s+([0-9.]+)\s*$", line)
        if m:
            cur["states"][m.group(1)] = float(m.group(2))
        m = re.match(r"\s+Elapsed Cycles\s+cycle\s+([0-9,]+)\s*$", line)
        if m:
            cur["cycles"] = int(m.group(1).replace(",", ""))
    return out


bars = []
for arg in sys.argv[2:]:
    label, spec = arg.split("=", 1)
    path, _, sel = spec.partition(":")
    ls = launches(path)
    for i in ([int(x) for x in sel.split(",")] if sel else range(1, len(ls) + 1)):
        bars.append((f"{label} {i}" if not sel or "," in sel else label, ls[i - 1]))
print(f"{'launch':28s} {'cycles':>7s} " + " ".join(f"{k.replace('Stall ', '')[:9]:>9s}" for k in KEEP) + "  other")
for label, l in bars:
    st = l["states"]
    other = sum(v for k, v in st.items() if k not in KEEP)
    print(f"{label:28s} {l.get('cycles', 0):7d} " + " ".join(f"{st.get(k, 0):9.2f}" for k in KEEP) + f"  {other:5.2f}")
fig, ax = plt.subplots(figsize=(11.5, 4.8))
bottom = [0.0] * len(bars)
for k in KEEP + ["other"]:
    vals = [(sum(v for kk, v in l["states"].items() if kk not in KEEP) if k == "other" else l["states"].get(k, 0))
            for _, l in bars]
    ax.bar(range(len(bars)), vals, bottom=bottom, label=k.replace("Stall ", ""))
    bottom = [b + v for b, v in zip(bottom, vals)]
for i, (_, l) in enumerate(bars):
    ax.text(i, bottom[i] + 0.3, f"{l.get('cycles', 0)} cyc", ha="center", fontsize=8)
ax.set_xticks(range(len(bars)))
ax.set_xticklabels([b[0] for b in bars], rotation=20, ha="right", fontsize=8)
ax.set_ylabel("warp cycles per issued instruction")
ax.set_title("General kernels at W = 1, V3 1 token, under ncu (H200): where a warp's cycles go")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=120)
