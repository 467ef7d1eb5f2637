#!/usr/bin/env bash
# No symbol is defined in two of epkit's shared libraries: each function, variable and type's
# vtable or type info has one home. Checked on the dynamic symbol tables (nm -D): every epkit::
# symbol, and every strong symbol, must be defined by at most one library. Weak instantiations of
# other libraries' templates (the C++ standard library's, CCCL's), which several of our libraries
# instantiate from the same headers, are allowed and counted.
# Usage: check_symbols.sh LIB.so...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 LIB.so LIB.so..." >&2; exit 2; }
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for lib in "$@"; do
  [ -f "$lib" ] || { echo "check_symbols: $lib not found" >&2; exit 2; }
  nm -D --defined-only "$lib" | awk -v L="$(basename "$lib")" 'NF >= 3 {print $3, $2, L}'
done | sort > "$tmp"
bad=0
while read -r sym; do
  lines=$(grep -F -- "$sym " "$tmp" | awk -v s="$sym" '$1 == s')
  types=$(echo "$lines" | awk '{print $2}' | sort -u | tr -d '\n')
  libs=$(echo "$lines" | awk '{print $3}' | tr '\n' ' ')
  demangled=$(echo "$sym" | c++filt)
  if [[ "$demangled" == *epkit* ]] || [[ "$types" =~ [TDBRtdbr] ]]; then
    echo "defined in several libraries: $demangled ($types) in $libs"
    bad=1
  fi
done < <(awk '{print $1}' "$tmp" | uniq -d)
weak=$(awk '{print $1}' "$tmp" | uniq -d | wc -l)
echo "check_symbols: $(awk '{print $3}' "$tmp" | sort -u | wc -l) libraries, $(wc -l < "$tmp") exported symbols, $weak weak third-party instantiations shared"
exit $bad
