#!/usr/bin/env bash
# The levels demo built with Nitro's compiled library and header-only trains to the same losses, bit
# for bit: every metrics row (a loss every 10 optimizer steps) of every fixed level. level::Auto is
# left out: it picks its configuration from timings, which differ between any two runs.
#   demo_modes.sh <levels (compiled)> <levels (header-only)> <scratch directory>
set -euo pipefail
compiled=$(realpath "$1")  # the runs below are in the scratch directory
header_only=$(realpath "$2")
dir=$3
rm -rf "$dir"
mkdir -p "$dir"
# 24 optimizer steps: rows at steps 10 and 20 of each level. --train-all: every level trains, whatever
# level::Auto's trial measures (without it, a level the trial finds 3x slower than Basic is not trained)
args=(--epochs 1 --samples 1536 --batch 64 --train-all)
(cd "$dir" && "$compiled" "${args[@]}" --metrics compiled >compiled.log 2>&1) || { cat "$dir/compiled.log"; exit 1; }
(cd "$dir" && "$header_only" "${args[@]}" --metrics header_only >header_only.log 2>&1) || { cat "$dir/header_only.log"; exit 1; }
losses() { sed -E 's/.*"step":([0-9]+).*"loss":([^,]+),.*/\1 \2/' "$1"; }
rows=0
for level in basic basic_fused advanced ultra; do
  a=$(losses "$dir/compiled/$level.jsonl")
  b=$(losses "$dir/header_only/$level.jsonl")
  [ -n "$a" ] || { echo "demo_modes: no metrics rows for $level"; exit 1; }
  if [ "$a" != "$b" ]; then
    echo "demo_modes: $level's losses differ between the compiled library and header-only:"
    diff <(echo "$a") <(echo "$b") || true
    exit 1
  fi
  rows=$((rows + $(echo "$a" | wc -l)))
done
echo "demo_modes: $rows losses of 4 levels equal bit for bit, compiled library and header-only"
