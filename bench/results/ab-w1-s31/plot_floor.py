#!/usr/bin/env python3
"""Session 31, call 2 (one H100): the protocol probe beside the library's kernels, V3 1 token, W = 1.
Bars: event-timed dispatch + combine (medians over the probe's three rounds / the bench's rounds);
markers: graph replay per pair. Usage: plot_floor.py CALL_DIR OUT.png"""
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

call, out = sys.argv[1], sys.argv[2]
probe = open(f"{call}/probe.txt").read().splitlines()


def probe_median(prefix, graph):
    vals = []
    for line in probe:
        if not line.startswith(prefix) or "[pre]" in line:
            continue
        m = re.search(r"graph, per pair: median +([0-9.]+)" if graph else r"sum-of-medians +([0-9.]+)", line)
        if m:
            vals.append(float(m.group(1)))
    return statistics.median(vals)


def bench(name):  # the "median over" line of V3 at 1 token: dispatch, combine, total, graph
    text = open(f"{call}/{name}.txt").read()
    line = re.search(r"median over.*\n(?:.*\n)*?\s+tip\s+decode\s+1 auto\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", text)
    return float(line.group(3)), float(line.group(4))


rows = [
    ("probe:\none-pass shape", probe_median("one-pass pair", False), probe_median("graph: one-pass pair", True)),
    ("library:\nW = 1 kernels", *bench("local")),
    ("probe:\ngeneral protocol", probe_median("pair: + histogram + combine protocol", False),
     probe_median("graph: + histogram + combine protocol", True)),
    ("library:\ngeneral kernels", *bench("general")),
]
floor = probe_median("floor: empty", False)
fig, ax = plt.subplots(figsize=(8, 4.5))
colors = ["#9ecae1", "#3182bd", "#fdae6b", "#e6550d"]
for i, (label, ev, gr) in enumerate(rows):
    ax.bar(i, ev, color=colors[i])
    ax.text(i, ev + 0.2, f"{ev:.1f}", ha="center", fontsize=9)
    ax.plot(i, gr, "v", color="black", markersize=8, label="graph replay per pair" if i == 0 else None)
    ax.text(i + 0.12, gr, f"{gr:.1f}", va="center", fontsize=8)
ax.axhline(2 * floor, color="gray", linestyle=":", label=f"harness floor, two calls ({2 * floor:.1f} us)")
ax.axhline(12, color="red", linestyle="--", label="issue 15's line (12 us)")
ax.set_xticks(range(len(rows)), [r[0] for r in rows])
ax.set_ylabel("dispatch + combine, V3 1 token (us, median)")
ax.set_title("The protocol's own floor at W = 1 (one H100, session 31 call 2)")
ax.set_ylim(0, 18)
ax.legend(loc="upper left", fontsize=8)
fig.tight_layout()
fig.savefig(out, dpi=110)
print("wrote", out)
