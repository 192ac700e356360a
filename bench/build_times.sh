#!/usr/bin/env bash
# How long the README's two commands take on a fresh clone of this repository: `make test`, then
# `make demo` twice (the second run is the one a user makes every day). Dependencies already on the
# machine (LibTorch's cached environment) are used, not installed again; on a new machine add their
# download. Prints RESULT lines; bench/record.py keeps them:
#   python3 bench/record.py --name build_times -- bash bench/build_times.sh
#
#   bash bench/build_times.sh [COMMIT]        (default HEAD; the clone is made in a temporary folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
commit=${1:-HEAD}
work=$(mktemp -d "${TMPDIR:-/tmp}/nitro-build-times.XXXXXX")
trap 'rm -rf "$work"' EXIT
git clone --quiet "$root" "$work/nitro"
cd "$work/nitro"
git checkout --quiet "$commit"
echo "build_times: a fresh clone of $(git rev-parse --short HEAD) in $work/nitro, $(nproc) cores"
start=$SECONDS
make test >"$work/test.log" 2>&1 || { tail -40 "$work/test.log"; echo "build_times: make test failed"; exit 1; }
test_s=$((SECONDS - start))
tail -3 "$work/test.log"
demo_s=() train_s=()
for run in 1 2; do
  start=$SECONDS
  make demo >"$work/demo.$run.log" 2>&1 || { tail -40 "$work/demo.$run.log"; echo "build_times: make demo failed"; exit 1; }
  demo_s+=($((SECONDS - start)))
  train_s+=("$(sed -n 's/.*trained in \([0-9.]*\) s.*/\1/p' "$work/demo.$run.log" | tail -1)")
  echo "build_times: make demo run $run: ${demo_s[-1]} s, training ${train_s[-1]:-?} s"
done
echo "RESULT make_test_seconds=$test_s goal<=2700 $([ "$test_s" -le 2700 ] && echo PASS || echo MISS)"
echo "RESULT make_demo_first_seconds=${demo_s[0]} goal<=300 $([ "${demo_s[0]}" -le 300 ] && echo PASS || echo MISS)"
echo "RESULT make_demo_again_seconds=${demo_s[1]} goal<=150 $([ "${demo_s[1]}" -le 150 ] && echo PASS || echo MISS)"
if [ -n "${train_s[1]}" ]; then
  awk -v t="${train_s[1]}" 'BEGIN { printf "RESULT make_demo_training_seconds=%s goal<=120 %s\n", t, (t <= 120 ? "PASS" : "MISS") }'
fi
