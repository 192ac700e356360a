#!/usr/bin/env bash
# The GPU round in two device calls, each well inside the device's 600 s per call. A call may land on
# a fresh machine (it is handed back after 30 s idle), so each configures and builds what it runs:
#
#   bash bench/run_gpu.sh tests            configure the `gpu` preset, build the test programs, run the
#                                          tests labelled gpu (ctest -L gpu), one at a time
#   bash bench/run_gpu.sh bench [names]    configure, build the benchmarks that have a GPU mode and the
#                                          levels demo, run them (names: a subset, e.g. bench_prefetch)
#   bash bench/run_gpu.sh peers [options]  configure, build peer_nitro, run bench/peers/compare.py on the
#                                          GPU against PyTorch eager (AMP), torch.compile (no Lightning:
#                                          it is not installed there and there is no registry); options go
#                                          to compare.py (e.g. --rounds 2 --workloads mlp,cnn); the
#                                          results JSON lands in $OUT/results-gpu.json, for plot_peers.py
#
# Here, once:     ../shared/gpu/prepare.sh     (makes .gpu/: doctest, GSL and zlib for that machine)
# Device calls:   command "bash bench/run_gpu.sh tests", carry [".gpu"]; then "bash bench/run_gpu.sh bench"
# Each step prints its command, its exit code and its seconds; everything lands in $OUT/<step>.txt,
# and the call ends with a summary and the RESULT lines. `budget=N` (seconds, default 560) bounds each
# call: the tests, and each benchmark, get what is left of it (timeout); a benchmark with under 20 s
# left is not started. Without a GPU (a rehearsal here) the same
# commands complete: the gpu tests skip, the benchmarks run their CPU variants.
#
# The GPU machine has CUDA, cuDNN, ninja and PyTorch (python3), and no package registry: LibTorch is
# the one inside its PyTorch; doctest, GSL and zlib come from the carried .gpu/ (zlib is optional:
# without it the trace-reading tests and benchmark rows are skipped).
set -uo pipefail
part=${1:-}
case "$part" in
  tests | bench | peers) shift ;;
  *) echo "usage: bash bench/run_gpu.sh tests | bench [benchmark names...] | peers [compare.py options]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/build-gpu/out}
mkdir -p "$out"
start=$SECONDS
if [ -f .gpu/env.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
else
  prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || { echo "run_gpu: python3 cannot import torch"; exit 1; }
  export CMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi
python=$(command -v python3)

status=0
summary=()
step() { # name command...: runs it, tees its output to $out/<name>.txt, prints and keeps its exit code and time
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$out/$name.txt"
  rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-22s exit %3s %5s s' "$name" "$rc" "$((SECONDS - t0))")")
  echo "=== $name: exit $rc, $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || status=1
  return "$rc"
}
finish() {
  echo "=== summary ($part, $((SECONDS - start)) s in all)"
  printf '%s\n' "${summary[@]}"
  if [ "$part" = bench ] || [ "$part" = peers ]; then
    echo "=== RESULT lines"
    # Not grep over the files: one that is not there (peers.txt in a bench call) fails it (and, under
    # pipefail, a cat) after the lines were printed.
    { cat "$out"/bench_*.txt "$out"/peers.txt 2>/dev/null || true; } | grep '^RESULT ' || echo "(no benchmark printed RESULT lines)"
  fi
  exit $status
}

{ if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi: not found (no GPU here)"; fi
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
  echo "cores: $(nproc)"; } >"$out/machine-$part.txt" 2>&1
cat "$out/machine-$part.txt"

# The reference tests (Python's GradScaler on the same GPU) run with the machine's python3.
step configure cmake --preset gpu -DNITRO_PYTHON="$python" || finish
if [ "$part" = tests ]; then
  step build cmake --build --preset gpu -j "$(nproc)" --target test_core test_hw test_data test_train test_memory \
    test_monitor test_io test_snapshot test_optim test_graph test_dist test_cache test_image || finish
  # One at a time: they share the one GPU, and several time what the device does. Bounded by what is
  # left of the call's budget, so the summary always prints.
  step tests timeout $(( ${budget:-560} - (SECONDS - start) )) ctest --preset gpu -L gpu --timeout 300
elif [ "$part" = peers ]; then
  step build cmake --build --preset gpu -j "$(nproc)" --target peer_nitro nitro_peer_tracking || finish
  # compare.py starts no round past its budget; the call's timeout bounds the rest.
  left=$(( ${budget:-560} - (SECONDS - start) ))
  if [ "$left" -lt 60 ]; then echo "run_gpu: ${left} s left: peers not started"; finish; fi
  # SIGTERM from timeout makes compare.py summarise the rounds it completed (never nothing).
  step peers timeout "$left" "$python" bench/peers/compare.py --device "$( "$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')" \
    --build build-gpu --python "$python" --rounds 2 --budget $(( left / 2 )) --timeout 300 --skip lightning \
    --out "$out/results-gpu.json" "$@"
else
  benches=("$@")
  [ ${#benches[@]} -gt 0 ] || benches=(bench_loop_overhead bench_checkpoint bench_monitor bench_batch_finder bench_prefetch bench_optimizer bench_graphs bench_pipeline bench_images)
  step build cmake --build --preset gpu -j "$(nproc)" --target "${benches[@]}" levels || finish
  # Each program gets at most what is left of the call's budget (`budget` s, default 560, under the
  # device's 600), so the call always ends with its summary rather than being cut off.
  for b in "${benches[@]}" levels; do
    left=$(( ${budget:-560} - (SECONDS - start) ))
    if [ "$left" -lt 20 ]; then
      summary+=("$(printf '%-22s not run: %s s left of the budget' "$b" "$left")")
      status=1
      continue
    fi
    if [ "$b" = levels ]; then
      step levels timeout "$left" build-gpu/examples/levels --epochs 1 --metrics "$out/demo-metrics"
    else
      step "$b" timeout "$left" "build-gpu/bench/$b"
    fi
  done
fi
finish
