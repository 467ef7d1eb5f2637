#!/usr/bin/env python3
"""Checks the communication kernels' PTX for parameter loads that no field explains.

nvcc 13.0 compiled a copy of an object built from a __grid_constant__ parameter into loads from the
parameter at the copy's own field offsets (grid_constant_copy.cu). On the GPU that reads unrelated
fields; here, without a GPU, it shows as an 8-byte load from a parameter struct at an offset where
the struct has no 8-byte field (the miscompile that once broke the one-warp dispatch read
CommParams' int pair max_tokens | weights_at_dispatch as a 64-bit multiplier).

For every kernel (.entry) of the given PTX files whose parameters are CommParams and DispatchIO or
CombineIO, every ld.param of 8-byte elements, whether addressed through the parameter's symbol or a
register derived from it (mov / add / cvta), must start at one of the struct's 8-byte fields (or an
element of an 8-byte array field). Field offsets come from the header itself: the struct
definitions are parsed for member names and compiled with the host compiler into an offsetof table.
Loads through generic pointers (callees that were not inlined) are not seen.

  check_param_loads.py --cxx g++ --header src/kernels/kernel_params.hpp -I include -I src \
      -I /usr/local/cuda/include FILE.ptx...

Exit 0: every such load is explained; 1: some are not (each printed); 2: usage or setup error.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

STRUCTS = ["CommParams", "DispatchIO", "CombineIO"]


def struct_members(header_text, name):
    m = re.search(r"^struct %s \{\n(.*?)^\};" % name, header_text, re.S | re.M)
    if not m:
        raise SystemExit(f"check_param_loads: struct {name} not found in the header")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    members = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl or "(" in decl:
            continue
        # "type a, b[4], *c": the type is everything before the first declarator.
        parts = [p.strip() for p in decl.split(",")]
        first = re.match(r"(.*?)([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*(=.*)?$", parts[0])
        if not first:
            continue
        typ = first.group(1).strip()
        names = [first.group(2)]
        for p in parts[1:]:
            mm = re.match(r"\**\s*([A-Za-z_]\w*)", p)
            if mm:
                names.append(mm.group(1))
        members += [(typ, n) for n in names]
    return members


def member_lines(text, s, prefix, expr):
    """printf lines for the members of struct s reached as expr (nested structs of the header expanded)."""
    out = []
    for typ, f in struct_members(text, s):
        if re.fullmatch(r"\w+", typ) and re.search(r"^struct %s \{" % typ, text, re.M):
            out += member_lines(text, typ, f"{prefix}{f}.", f"{expr}.{f}")
            continue
        out.append(f'    printf("%s {prefix}{f} %zu %zu %zu\\n", top, static_cast<size_t>('
                   f'reinterpret_cast<const char*>(&{expr}.{f}) - reinterpret_cast<const char*>(o)), '
                   f'sizeof({expr}.{f}), elem_size({expr}.{f}));')
    return out


def field_table(args):
    text = open(args.header).read()
    lines = ["#include <cstddef>", "#include <cstdio>", "#include <type_traits>",
             f'#include "{os.path.abspath(args.header)}"', "using namespace epkit::kernels;",
             "template <typename T> constexpr size_t elem_size(const T&) { return sizeof(T); }",
             "template <typename T, size_t N> constexpr size_t elem_size(const T (&)[N]) { return sizeof(T); }",
             "int main() {"]
    for s in STRUCTS:
        lines.append(f'  printf("struct {s} %zu\\n", sizeof({s}));')
        lines.append(f'  {{ static {s} obj{{}}; const {s}* o = &obj; const char* top = "{s}";')
        lines += member_lines(text, s, "", "obj")
        lines.append("  }")
    lines.append("}")
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "t.cpp"), os.path.join(d, "t")
        open(src, "w").write("\n".join(lines) + "\n")
        cmd = [args.cxx, "-std=c++17", "-w"] + [f"-I{i}" for i in args.include] + [src, "-o", exe]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            sys.stderr.write(r.stderr)
            raise SystemExit(2)
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    sizes, eight = {}, {s: set() for s in STRUCTS}
    covered = {s: 0 for s in STRUCTS}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "struct":
            sizes[w[1]] = int(w[2])
            continue
        s, off, size, elem = w[0], int(w[2]), int(w[3]), int(w[4])
        covered[s] += size
        if elem == 8:
            eight[s].update(range(off, off + size, 8))
    for s in STRUCTS:  # every member was found: the members' bytes plus padding make the size
        if covered[s] > sizes[s] or sizes[s] - covered[s] >= 8 * 4:
            raise SystemExit(f"check_param_loads: {s}: members cover {covered[s]} of {sizes[s]} bytes; "
                             "the header parse missed some")
    return sizes, eight


LD = re.compile(r"ld\.param(?:\.(v[24]))?\.([a-z]+)(\d+)\s+(\{[^}]*\}|%\w+)\s*,\s*\[([^\]]+)\]")
ENTRY = re.compile(r"\.entry\s+(\S+)\(")
PARAM_DECL = re.compile(r"\.param\s+\.align\s+\d+\s+\.b8\s+(\S+)_param_(\d+)\[(\d+)\]")
MOV = re.compile(r"^\s*mov\.b64\s+(%\w+),\s*(\S+)_param_(\d+);")
ADD = re.compile(r"^\s*add\.s64\s+(%\w+),\s*(%\w+),\s*(-?\d+);")
CVTA = re.compile(r"^\s*cvta\.param\.u64\s+(%\w+),\s*(%\w+);")


def check_ptx(path, sizes, eight):
    bad, checked, kernels = [], 0, 0
    text = open(path).read()
    for chunk in re.split(r"(?=\.visible \.entry|\.entry )", text)[1:]:
        m = ENTRY.search(chunk)
        if not m:
            continue
        name = m.group(1)
        # Which struct each parameter is: CommParams is 0; the IO struct is 1 (by the mangled name).
        decl = {int(p): int(n) for _, p, n in PARAM_DECL.findall(chunk[:4000])}
        if "CommParams" not in name or decl.get(0) != sizes["CommParams"]:
            continue
        io = "DispatchIO" if "DispatchIO" in name else "CombineIO" if "CombineIO" in name else None
        kinds = {0: "CommParams"}
        if io and decl.get(1) == sizes[io]:
            kinds[1] = io
        kernels += 1
        base = {}  # register -> (param index, byte offset)
        for line in chunk.splitlines():
            if line == "}":  # the end of the kernel's body (.func bodies may follow)
                break
            mm = MOV.match(line)
            if mm:
                base[mm.group(1)] = (int(mm.group(3)), 0)
                continue
            mm = ADD.match(line) or CVTA.match(line)
            if mm and mm.group(2) in base:
                p, o = base[mm.group(2)]
                base[mm.group(1)] = (p, o + (int(mm.group(3)) if mm.re is ADD else 0))
                continue
            ml = LD.search(line)
            if not ml:
                continue
            vec, _, bits, _, addr = ml.groups()
            if int(bits) != 64:
                continue
            addr = addr.replace(" ", "")
            am = re.match(r"(%\w+|\S+_param_(\d+))(?:\+(-?\d+))?$", addr)
            if not am:
                continue
            if am.group(1).startswith("%"):
                if am.group(1) not in base:
                    continue
                p, o = base[am.group(1)]
            else:
                p, o = int(am.group(2)), 0
            if p not in kinds:
                continue
            off = o + int(am.group(3) or 0)
            n = {None: 1, "v2": 2, "v4": 4}[vec]
            for i in range(n):
                checked += 1
                if off + 8 * i not in eight[kinds[p]]:
                    bad.append(f"{os.path.basename(path)}: {name[:120]}: '{line.strip()}': {kinds[p]} has no "
                               f"8-byte field at offset {off + 8 * i}")
    return bad, checked, kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cxx", default="c++")
    ap.add_argument("--header", required=True)
    ap.add_argument("-I", dest="include", action="append", default=[])
    ap.add_argument("ptx", nargs="+")
    args = ap.parse_args()
    sizes, eight = field_table(args)
    bad, checked, kernels = [], 0, 0
    for f in args.ptx:
        b, c, k = check_ptx(f, sizes, eight)
        bad += b
        checked += c
        kernels += k
    if kernels == 0 or checked == 0:
        print(f"check_param_loads: no kernel with CommParams parameters, or no 8-byte parameter load, in "
              f"{' '.join(args.ptx)}: nothing was checked")
        return 2
    for b in bad:
        print(b)
    print(f"check_param_loads: {kernels} kernels, {checked} 8-byte parameter loads, {len(bad)} at no 8-byte field")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
