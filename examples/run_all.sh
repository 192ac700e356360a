#!/usr/bin/env bash
# Runs every example of examples/runs.txt twice in a row, small, in one working folder, as a user would
# after `make examples` (the second run finds what the first left: snapshots, metrics, generated data),
# and checks each run printed what the list expects. Fails at the first example that fails.
#
#   bash examples/run_all.sh [BUILD_EXAMPLES_DIR]      (default build-release/examples)
set -euo pipefail
bin=$(cd "${1:-build-release/examples}" && pwd)
runs=$(cd "$(dirname "$0")" && pwd)/runs.txt
work=$(mktemp -d "${TMPDIR:-/tmp}/nitro-examples.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
# The examples that make their data write it under the temporary folder (std::filesystem's
# temp_directory_path): here, so that the first run makes it and nothing is left behind.
export TMPDIR=$work
while IFS= read -r line; do
  case $line in '#'* | '') continue ;; esac
  run=${line%%|*} expect=${line#*|}
  read -ra argv <<<"$run"
  name=${argv[0]}
  if [ ! -x "$bin/$name" ]; then
    echo "run_all: $name is not built in $bin; skipped"
    continue
  fi
  for round in 1 2; do
    start=$SECONDS
    if ! "$bin/$name" "${argv[@]:1}" </dev/null >"$work/$name.$round.log" 2>&1; then
      tail -20 "$work/$name.$round.log"
      echo "run_all: $name failed in run $round: $bin/$run"
      exit 1
    fi
    if ! grep -Eq -- "$expect" "$work/$name.$round.log"; then
      tail -20 "$work/$name.$round.log"
      echo "run_all: $name run $round did not print what examples/runs.txt expects: $expect"
      exit 1
    fi
    echo "run_all: $name run $round ok in $((SECONDS - start)) s: $(tail -1 "$work/$name.$round.log" | cut -c1-100)"
  done
done <"$runs"
echo "run_all: every example ran twice"
