#!/usr/bin/env bash
# Runs every example twice in a row, small, in one working folder, as a user would after `make examples`
# (the second run finds what the first left: snapshots, metrics, generated data). Fails at the first
# example that fails.
#
#   bash examples/run_all.sh [BUILD_EXAMPLES_DIR]      (default build-release/examples)
set -euo pipefail
bin=$(cd "${1:-build-release/examples}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/nitro-examples.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
# The examples that make their data write it under the temporary folder (std::filesystem's
# temp_directory_path): here, so that the first run makes it and nothing is left behind.
export TMPDIR=$work
runs=(
  "quickstart --epochs 1 --samples 512 --batch 64"
  "cached_epochs"
  "prefetch_cached"
  "custom_module --epochs 1 --samples 512 --batch 64"
  "records --epochs 1 --samples 512 --batch 64"
  "resume --epochs 2 --every 2 --dir $work/resume"
  "regression --epochs 2 --dir $work/regression"
  "own_dataset --epochs 2 --samples 512 --dir $work/own_dataset"
  "fine_tune --pretrain-samples 1024 --pretrain-epochs 1 --epochs 2 --dir $work/fine_tune"
  "dcgan --dir $work/dcgan --iterations 8 --every 4 --images 256"
  "serve --seconds 1"
  "ddp --epochs 1 --dir $work/ddp"
  "image_folder --epochs 1 --samples 64 --batch 16"
  "detection --epochs 2 --images 96 --batch 16"
  "sequence --epochs 2 --samples 512 --autotune-cache $work/autotune"
)
for run in "${runs[@]}"; do
  read -ra argv <<<"$run"
  name=${argv[0]}
  if [ ! -x "$bin/$name" ]; then
    echo "run_all: $name is not built in $bin; skipped"
    continue
  fi
  for round in 1 2; do
    start=$SECONDS
    if ! "$bin/$name" "${argv[@]:1}" >"$work/$name.$round.log" 2>&1; then
      tail -20 "$work/$name.$round.log"
      echo "run_all: $name failed in run $round: $bin/$run"
      exit 1
    fi
    echo "run_all: $name run $round ok in $((SECONDS - start)) s: $(tail -1 "$work/$name.$round.log" | cut -c1-100)"
  done
done
echo "run_all: every example ran twice"
