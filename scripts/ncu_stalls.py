#!/usr/bin/env python3
"""Where the warps of a profiled kernel wait: a summary of Nsight Compute's source page.

Input: the CSVs that `ncu -i REPORT --page source --csv --print-source sass` (SASS) and, optionally,
`... --print-source cuda,sass` (the same instructions under their source lines; needs a -lineinfo
build) print. Both may be xz-compressed. One section per profiled launch.

  ncu_stalls.py SASS.csv[.xz] [--src CUDA_SASS.csv[.xz]] --kernel NAME [--launch N]
                [--lines 30] [--insts 40]

Prints, per launch of kernels whose name contains NAME (or only launch N, 1-based, counted over
those launches; ncu prints some launches' sections twice, and the copies are dropped): the warp-instructions executed, the stall-reason totals of the warp samples, the source
lines with the most samples, the instructions with the most samples (with their top reasons), and
a histogram of instructions by how many warps executed them: in a kernel whose blocks mostly wait
(decode), instructions that every warp runs are the common path and those a few warps run are the
critical warps' own work.
"""
import argparse
import collections
import csv
import io
import lzma
import sys

csv.field_size_limit(1 << 30)


def open_text(path):
    return io.TextIOWrapper(lzma.open(path), encoding="utf-8") if path.endswith(".xz") else open(path, encoding="utf-8")


def sections(path):
    """(kernel name, header, rows) per launch."""
    name, hdr, rows = None, None, []
    for r in csv.reader(open_text(path)):
        if not r:
            continue
        if r[0] in ("Kernel Name", "Function Name"):
            if name is not None:
                yield name, hdr, rows
            name, hdr, rows = r[1], None, []
        elif hdr is None:
            hdr = r
        else:
            rows.append(r)
    if name is not None:
        yield name, hdr, rows


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def address_lines(path):
    """Instruction address -> (line number, source text) from a cuda,sass CSV."""
    out = {}
    for _, _, rows in sections(path):
        line = text = None
        for r in rows:
            if r[0]:
                line, text = r[0], r[1]
            elif len(r) > 2 and r[2].startswith("0x"):
                out.setdefault(r[2], (line, text))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass")
    ap.add_argument("--src", help="the cuda,sass CSV of the same report (source lines)")
    ap.add_argument("--kernel", required=True, help="substring of the kernel name")
    ap.add_argument("--launch", type=int, default=0, help="only this matching launch (1-based); 0: each")
    ap.add_argument("--lines", type=int, default=25)
    ap.add_argument("--insts", type=int, default=30)
    a = ap.parse_args()
    amap = address_lines(a.src) if a.src else {}
    k = 0
    seen = set()
    for name, hdr, rows in sections(a.sass):
        if a.kernel not in name:
            continue
        key = (name, tuple(map(tuple, rows)))
        if key in seen:  # ncu may print a launch's section twice, word for word
            continue
        seen.add(key)
        k += 1
        if a.launch and k != a.launch:
            continue
        ix = {h: i for i, h in enumerate(hdr)}
        stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
        base = int(rows[0][ix["Address"]], 16)
        tot = collections.Counter()
        per_line = collections.Counter()
        line_text = {}
        warps = collections.Counter()
        insts = []
        for r in rows:
            addr, sass = r[ix["Address"]], r[ix["Source"]].strip()
            # Without the InstructionStats section (warp sampling alone) there is no executed count.
            n = num(r[ix["Instructions Executed"]]) if "Instructions Executed" in ix else 0
            s = num(r[ix["Warp Stall Sampling (All Samples)"]])
            reasons = {h[6:]: num(r[ix[h]]) for h in stalls if num(r[ix[h]]) > 0}
            tot.update(reasons)
            tot["samples"] += s
            tot["executed"] += n
            if n > 0:
                warps[int(n)] += 1
            ln = amap.get(addr, ("?", ""))
            per_line[ln[0]] += s
            line_text[ln[0]] = ln[1]
            insts.append((s, int(addr, 16) - base, n, sass, ln[0], reasons))
        print(f"== launch {k}: {name[:110]}")
        print(f"warp-instructions executed {tot['executed']:.0f}, warp samples {tot['samples']:.0f}")
        print("stall reasons (share of samples):")
        for r, v in sorted(((r, v) for r, v in tot.items() if r not in ("samples", "executed")), key=lambda x: -x[1])[:12]:
            print(f"  {r:20s} {v:7.0f} {100 * v / max(tot['samples'], 1):5.1f}%")
        print("instructions by warps that executed them (warps: instructions):")
        print("  " + " ".join(f"{w}:{c}" for w, c in sorted(warps.items())))
        # The same samples split by how many warps ran the instruction: at decode the instructions
        # few warps run are the critical warps' chain, and their reasons are what bounds it.
        top = max(warps) if warps else 1
        buckets = [("1 warp", 1, 1), ("2-8 warps", 2, 8), (f"9-{top // 2} warps", 9, top // 2),
                   (f">{top // 2} warps (common path)", top // 2 + 1, top)]
        print("samples by warps that ran the instruction (bucket: samples, top reasons):")
        for label, lo, hi in buckets:
            if lo > hi:
                continue
            c = collections.Counter()
            for s, _, n, _, _, reasons in insts:
                if lo <= n <= hi:
                    c["samples"] += s
                    c.update(reasons)
            rs = " ".join(f"{r}={v:.0f}" for r, v in sorted(((r, v) for r, v in c.items() if r != "samples"),
                                                             key=lambda x: -x[1])[:5])
            print(f"  {label:28s} {c['samples']:6.0f}  {rs}")
        if amap:
            print("source lines with the most samples:")
            for ln, v in per_line.most_common(a.lines):
                print(f"  {v:6.0f} L{ln}: {line_text[ln][:100]}")
        print("instructions with the most samples (offset, samples, warps, SASS, line, reasons):")
        for s, off, n, sass, ln, reasons in sorted(insts, key=lambda x: -x[0])[: a.insts]:
            rs = " ".join(f"{r}={v:.0f}" for r, v in sorted(reasons.items(), key=lambda x: -x[1])[:3])
            print(f"  {off:05x} {s:5.0f} w={n:5.0f} {sass[:44]:44s} L{ln} {rs}")
    if k == 0:
        sys.exit(f"no launch of a kernel named *{a.kernel}* in {a.sass}")


if __name__ == "__main__":
    main()
