#!/usr/bin/env bash
# A/B of the kernels of several commits on one machine, in one session, with interleaved runs.
# Different machines of the same kind differ by ~1 us at decode sizes, so compare commits only this way.
#
#   scripts/bench-ab.sh prepare REF...           here: git archive each REF into .ab/<REF>/
#   scripts/bench-ab.sh run OUTDIR [--reps N] [-- epkit-bench args]
#                                                 on the GPU machine (carry ".ab"): builds epkit-bench
#                                                 of each tree and runs the trees in turn, N rounds
#
#   scripts/bench-ab.sh prepare-lib NAME REF      here: build libepkit.so of REF (or of the working
#                                                 tree with EPKIT_AB_FLAGS added to local.cu's compile
#                                                 line, and to the units in EPKIT_AB_UNITS, e.g.
#                                                 "kernels/dispatch kernels/combine", REF = .) into
#                                                 .ab/lib/NAME/, against ./build's
#                                                 libepkit_moe.so (the expert kernels, unchanged by a
#                                                 communication change): minutes on two cores, no GPU
#   scripts/bench-ab.sh run-libs OUTDIR BUILD [--reps N] [-- epkit-bench args]
#                                                 on the GPU machine (carry ".ab"): BUILD's epkit-bench
#                                                 with BUILD's libepkit.so ("tip") and with each
#                                                 .ab/lib/NAME/libepkit.so in turn (EPKIT_AB_LIBS="A B":
#                                                 only those), N rounds
#
# `run` and `run-libs` print one table row per (tree, round, case) and, last, the median over rounds
# per tree and case, so a change smaller than the round-to-round spread shows as such. The JSON of
# every run is kept in OUTDIR/<ref>-<round>.json. Default bench args: --preset decode --tokens 1,128
# --no-baselines. run-libs swaps only the library (LD_LIBRARY_PATH comes before the binary's
# RUNPATH), so it compares changes inside libepkit.so that keep its ABI: the bench binary is BUILD's.
set -uo pipefail
cd "$(dirname "$0")/.."
run_options() {  # [--reps N] [-- bench args] -> REPS, BENCH_ARGS
  REPS=2
  BENCH_ARGS=(--preset decode --tokens 1,128 --no-baselines)
  while [ $# -gt 0 ]; do
    case "$1" in
      --reps) REPS=$2; shift 2 ;;
      --) shift; BENCH_ARGS=("$@"); break ;;
      *) echo "unknown option $1" >&2; exit 2 ;;
    esac
  done
}

summarize() {  # summarize OUTDIR REPS TREE...: the table of every run, then the medians
  python3 - "$@" <<'EOF'
import json, statistics, sys
out, reps, trees = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
F = ["dispatch_us_median", "combine_us_median", "total_us_median", "graph_total_us_median"]
rows = {}
for t in trees:
    for r in range(1, reps + 1):
        for row in json.load(open(f"{out}/{t}-{r}.json"))["rows"]:
            if row["system"] != "epkit":
                continue
            path = row["path"] + ("+packed" if row.get("layout") == "packed" else "")
            key = (t, row["preset"], row["tokens"], path)
            rows.setdefault(key, []).append([row.get(f) for f in F])
            print(f"{t:>10} round {r}  {row['preset']:<14} {row['tokens']:>5} {path:<26}",
                  "  ".join(f"{v:9.1f}" if v is not None else "        -" for v in rows[key][-1]))
print(f"\nmedian over {reps} rounds: dispatch, combine, total, graph (us)")
for key, vals in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])):
    med = [statistics.median(v[i] for v in vals) if all(v[i] is not None for v in vals) else None for i in range(len(F))]
    spread = max(v[2] for v in vals) - min(v[2] for v in vals)
    print(f"{key[0]:>10}  {key[1]:<14} {key[2]:>5} {key[3]:<26}",
          "  ".join(f"{m:9.1f}" if m is not None else "        -" for m in med), f"  (total spread {spread:.1f})")
EOF
}

cmd=${1:-}
shift || true
case "$cmd" in
  prepare)
    [ $# -ge 1 ] || { echo "usage: $0 prepare REF..." >&2; exit 2; }
    rm -rf .ab && mkdir -p .ab
    for ref in "$@"; do
      sha=$(git rev-parse --short "$ref") || exit 1
      mkdir -p ".ab/$sha" && git archive "$ref" | tar -x -C ".ab/$sha" || exit 1
      echo "$ref -> .ab/$sha"
    done
    grep -qx '/.ab/' .gitignore || echo "note: .ab/ is not in .gitignore; pass carry [\".ab\"] to the device tool"
    ;;
  run)
    OUT=${1:?usage: $0 run OUTDIR [--reps N] [-- bench args]}
    shift
    run_options "$@"
    [ -d .ab ] || { echo "no .ab/: run '$0 prepare REF...' first and carry .ab" >&2; exit 2; }
    mkdir -p "$OUT"
    export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
    ngpu=$(nvidia-smi -L | grep -c '^GPU')
    trees=()
    for t in .ab/*/; do trees+=("$(basename "$t")"); done
    # The archived trees have no .deps: use this checkout's NVSHMEM unless NVSHMEM_HOME says otherwise
    # (else each tree finds python3's nvidia.nvshmem, as on the GPU box). Run scripts/setup-deps.sh first.
    NV=()
    if [ -z "${NVSHMEM_HOME:-}" ] && [ -f .deps/nvshmem/include/nvshmem.h ]; then NV=(-DNVSHMEM_HOME="$PWD/.deps/nvshmem"); fi
    # Likewise the CUTLASS headers (trees from 5541c3e on configure src/moe, which needs them).
    if [ -z "${CUTLASS_HOME:-}" ] && [ -f .deps/cutlass/include/cutlass/cutlass.h ]; then
      NV+=(-DCUTLASS_HOME="$(cd .deps/cutlass && pwd -P)")
    fi
    pids=()
    jobs=$(( $(nproc) / ${#trees[@]} )); [ "$jobs" -ge 1 ] || jobs=1
    for t in "${trees[@]}"; do
      ( cmake -S ".ab/$t" -B ".ab-build/$t" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPKIT_BUILD_TESTS=OFF "${NV[@]}" \
          > "$OUT/$t-build.log" 2>&1 &&
        cmake --build ".ab-build/$t" -j "$jobs" --target epkit-bench epkit-run >> "$OUT/$t-build.log" 2>&1 ) &
      pids+=($!)
    done
    rc=0
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" || { echo "build of ${trees[$i]} failed:"; tail -20 "$OUT/${trees[$i]}-build.log"; rc=1; }
    done
    [ $rc = 0 ] || exit 1
    for r in $(seq 1 "$REPS"); do
      for t in "${trees[@]}"; do
        ".ab-build/$t/bin/epkit-run" -n "$ngpu" -- ".ab-build/$t/bin/epkit-bench" "${BENCH_ARGS[@]}" \
          --json "$OUT/$t-$r.json" > "$OUT/$t-$r.log" 2>&1 || { echo "bench of $t failed:"; tail -20 "$OUT/$t-$r.log"; exit 1; }
      done
    done
    summarize "$OUT" "$REPS" "${trees[@]}"
    ;;
  prepare-lib)
    NAME=${1:?usage: $0 prepare-lib NAME REF}
    REF=${2:?usage: $0 prepare-lib NAME REF}
    [ -f build/src/moe/libepkit_moe.so ] || { echo "build ./build first (its libepkit_moe.so is linked)" >&2; exit 2; }
    dest="$PWD/.ab/lib/$NAME"
    rm -rf "$dest" && mkdir -p "$dest"
    if [ "$REF" = . ]; then
      # The working tree's objects, local.cu and all_to_all.cu (its stage-stamp reader) recompiled
      # with EPKIT_AB_FLAGS (e.g. -DEPKIT_STAGE_TIMERS for stage stamps of the W = 1 kernels);
      # EPKIT_AB_UNITS names other units (e.g. "kernels/dispatch kernels/combine": the general kernels).
      cmds=$(cd build && ninja -t commands src/libepkit.so)
      (cd build && ninja src/libepkit.so >/dev/null) || exit 1
      relink=$(tail -2 <<<"$cmds" | sed "s|CMakeFiles/epkit.dir/cmake_device_link.o|$dest/dlink.o|g; s|-o src/libepkit.so|-o $dest/libepkit.so|")
      for f in kernels/local host/all_to_all ${EPKIT_AB_UNITS:-}; do
        o="src/CMakeFiles/epkit.dir/$f.cu.o"
        cc=$(grep -- "-o $o" <<<"$cmds" | head -1)
        cc=${cc/ -c / ${EPKIT_AB_FLAGS:-} -c }
        cc=$(sed "s| -o $o| -o $dest/$(basename $f).o|; s| -MD -MT [^ ]* -MF [^ ]*||" <<<"$cc")
        (cd build && bash -c "$cc") || exit 1
        relink=$(sed "s|$o|$dest/$(basename $f).o|g" <<<"$relink")
      done
      echo "$relink" > "$dest/link.sh"
      (cd build && bash "$dest/link.sh") || exit 1
    else
      src="$PWD/.ab-build/lib-src-$NAME" bld="$PWD/.ab-build/lib-$NAME"
      rm -rf "$src" && mkdir -p "$src" && git archive "$REF" | tar -x -C "$src" || exit 1
      NV=()
      [ -f .deps/nvshmem/include/nvshmem.h ] && NV=(-DNVSHMEM_HOME="$PWD/.deps/nvshmem")
      [ -f .deps/cutlass/include/cutlass/cutlass.h ] && NV+=(-DCUTLASS_HOME="$(cd .deps/cutlass && pwd -P)")
      # EPKIT_AB_FLAGS reach every CUDA unit of a REF build (CMAKE_CUDA_FLAGS; EPKIT_AB_UNITS is for
      # the working tree only). Until session 31 they were dropped here, silently: that session's
      # stamps libraries of a commit came out without stamps.
      [ -n "${EPKIT_AB_FLAGS:-}" ] && NV+=(-DCMAKE_CUDA_FLAGS="$EPKIT_AB_FLAGS")
      cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPKIT_BUILD_TESTS=OFF "${NV[@]}" >/dev/null || exit 1
      cmds=$(cd "$bld" && ninja -t commands src/libepkit.so)
      objs=$(cd "$bld" && ninja -t inputs src/libepkit.so | grep 'CMakeFiles/epkit.dir/.*\.o$' | grep -v cmake_device_link)
      (cd "$bld" && ninja epkit_core $objs >/dev/null) || exit 1
      mkdir -p "$bld/CMakeFiles/epkit.dir"
      tail -2 <<<"$cmds" | sed "s|src/moe/libepkit_moe.so|$PWD/build/src/moe/libepkit_moe.so|g; s|-o src/libepkit.so|-o $dest/libepkit.so|" > "$dest/link.sh"
      (cd "$bld" && bash "$dest/link.sh") || exit 1
    fi
    rm -f "$dest"/*.o  # only the library travels
    # The relocatable device code (__nv_relfatbin) is for linking other code against this library,
    # never loaded at run time (the kernels come from .nv_fatbin): without it, libraries pack 2.4x
    # smaller (session 41: the same three in 4.3 MB instead of 10.2), so more fit a call's 64 MiB.
    # Session 41's libraries ran so on the box (call 1, one H200).
    objcopy --remove-section __nv_relfatbin "$dest/libepkit.so" || exit 1
    echo "$REF${EPKIT_AB_FLAGS:+ with $EPKIT_AB_FLAGS} -> .ab/lib/$NAME/libepkit.so"
    ;;
  run-libs)
    OUT=${1:?usage: $0 run-libs OUTDIR BUILD [--reps N] [-- bench args]}
    BLD=${2:?usage: $0 run-libs OUTDIR BUILD [--reps N] [-- bench args]}
    shift 2
    run_options "$@"
    mkdir -p "$OUT"
    export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
    ngpu=$(nvidia-smi -L | grep -c '^GPU')
    trees=(tip)
    if [ -n "${EPKIT_AB_LIBS:-}" ]; then  # a chosen subset, in that order
      for t in $EPKIT_AB_LIBS; do [ -f ".ab/lib/$t/libepkit.so" ] || { echo "no .ab/lib/$t/libepkit.so" >&2; exit 2; }; trees+=("$t"); done
    else
      for t in .ab/lib/*/; do [ -f "$t/libepkit.so" ] && trees+=("$(basename "$t")"); done
    fi
    # The libraries BUILD's binaries find through their RUNPATH: its own MoE library and NVSHMEM's.
    nvlib=$(sed -n 's|^_nvshmem_host:FILEPATH=||p' "$BLD/CMakeCache.txt")
    base="$PWD/$BLD/src/moe${nvlib:+:$(dirname "$nvlib")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for r in $(seq 1 "$REPS"); do
      for t in "${trees[@]}"; do
        if [ "$t" = tip ]; then lib="$PWD/$BLD/src"; else lib="$PWD/.ab/lib/$t"; fi
        [ "$r" = 1 ] && LD_LIBRARY_PATH="$lib:$base" ldd "$BLD/bin/epkit-bench" | grep libepkit > "$OUT/$t-ldd.txt"
        LD_LIBRARY_PATH="$lib:$base" "$BLD/bin/epkit-run" -n "$ngpu" -- "$BLD/bin/epkit-bench" "${BENCH_ARGS[@]}" \
          --json "$OUT/$t-$r.json" > "$OUT/$t-$r.log" 2>&1 || { echo "bench of $t failed:"; tail -20 "$OUT/$t-$r.log"; exit 1; }
      done
    done
    summarize "$OUT" "$REPS" "${trees[@]}"
    ;;
  *)
    echo "usage: $0 prepare REF... | $0 run OUTDIR [--reps N] [-- bench args]" >&2
    echo "       $0 prepare-lib NAME REF | $0 run-libs OUTDIR BUILD [--reps N] [-- bench args]" >&2
    exit 2
    ;;
esac
