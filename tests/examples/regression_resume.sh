#!/usr/bin/env bash
# examples/regression stopped by SIGTERM in the middle of an epoch and started again ends with the
# parameters of the run that never stopped: its learning-rate schedule, a function of the loop's
# optimizer step, is where it was, and so are the sampler and the optimizer.
#   regression_resume.sh <regression executable> <scratch directory>
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
args=(--epochs 4 --samples 2048)  # 32 batches an epoch: stopped in the second
"$bin" --dir "$dir/a" "${args[@]}" >"$dir/a.log"
"$bin" --dir "$dir/b" "${args[@]}" --stop-after 50 >"$dir/b1.log"
"$bin" --dir "$dir/b" "${args[@]}" >"$dir/b2.log"
show() { echo "--- $1"; cat "$dir/$1"; }
fail() { echo "regression_resume: $*"; show a.log; show b1.log; show b2.log; exit 1; }
grep -q "SIGTERM: snapshot written after optimizer step 51" "$dir/b1.log" || fail "the stopped run wrote no snapshot"
grep -q "resumed from .* at epoch 1, optimizer step 51" "$dir/b2.log" || fail "the second run did not resume"
a=$(grep -o 'done: 128 optimizer steps, .*parameters XXH64 [0-9a-f]*' "$dir/a.log") || fail "the first run did not finish"
b=$(grep -o 'done: 128 optimizer steps, .*parameters XXH64 [0-9a-f]*' "$dir/b2.log") || fail "the resumed run did not finish"
[ "$a" = "$b" ] || fail "the resumed run ended elsewhere: '$a' against '$b'"
# The rates of the epochs both runs printed after the stop are the same.
[ "$(grep '^epoch [34]:' "$dir/a.log")" = "$(grep '^epoch [34]:' "$dir/b2.log")" ] || fail "the schedule differs after the resume"
echo "regression_resume: resumed run equals the uninterrupted one ($a)"
