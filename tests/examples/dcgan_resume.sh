#!/usr/bin/env bash
# examples/dcgan stopped by SIGTERM in the middle of an epoch and started again ends with the
# parameters of the run that never stopped (both loops, the sampler, the generators and the
# sample noise in one snapshot), and each loop's monitor, paused while the other loop steps, does
# not count the other loop's step as waiting for data.
#   dcgan_resume.sh <dcgan executable> <scratch directory>
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
args=(--iterations 24 --every 8 --log-every 8 --images 640)  # 10 batches an epoch: 24 iterations cross two epochs
"$bin" --dir "$dir/a" "${args[@]}" >"$dir/a.log"
"$bin" --dir "$dir/b" "${args[@]}" --stop-after 13 >"$dir/b1.log"
"$bin" --dir "$dir/b" "${args[@]}" >"$dir/b2.log"
show() { echo "--- $1"; cat "$dir/$1"; }
fail() { echo "dcgan_resume: $*"; show a.log; show b1.log; show b2.log; exit 1; }
grep -q "SIGTERM: snapshot snapshot-000000000013-000000.nitro of iteration 13 written; exiting" "$dir/b1.log" ||
  fail "the stopped run did not write the snapshot of iteration 13"
grep -q "resumed from snapshot-000000000013-000000.nitro at iteration 13" "$dir/b2.log" || fail "the second run did not resume"
a=$(grep -o 'done: 24 iterations, parameters XXH64 [0-9a-f]*' "$dir/a.log") || fail "the first run did not finish"
b=$(grep -o 'done: 24 iterations, parameters XXH64 [0-9a-f]*' "$dir/b2.log") || fail "the resumed run did not finish"
[ "$a" = "$b" ] || fail "the resumed run ended with other parameters: '$a' against '$b'"
# Samples were drawn every 8 iterations, by both runs alike.
cmp -s "$dir/a/samples-24.pgm" "$dir/b/samples-24.pgm" || fail "the samples of iteration 24 differ"
# The generator's loop waits for no data (its batch is the discriminator's fake images); paused while
# the discriminator steps, its monitor must not call it data-bound.
if sed -n '/^generator:/,/^done:/p' "$dir/a.log" | grep -q "data-bound"; then fail "the generator's loop is called data-bound"; fi
echo "dcgan_resume: resumed run equals the uninterrupted one ($a)"
