#!/usr/bin/env bash
# The GPU round. One device call does all of it (`all`), within the device's 600 s per call; the parts
# can also run alone. A call may land on a fresh machine (it is handed back after 30 s idle), so each
# configures and builds what it runs:
#
#   bash bench/run_gpu.sh all              configure, ONE build (-j of the machine's cores) of the test
#                                          programs, the benchmarks with a GPU mode, the levels demo and
#                                          peer_nitro, then the gpu tests (at most tests_s, 90 s), the
#                                          benchmarks (at most bench_s, 170 s) and the comparison of the
#                                          real models (ResNet-50, GPT-2) with PyTorch, torch.compile and
#                                          Lightning until the call's budget: the runs in the order the
#                                          goals need them (compare.py --deadline), those left out listed
#   bash bench/run_gpu.sh tests            configure the `gpu` preset, build the test programs, run the
#                                          tests labelled gpu (ctest -L gpu), one at a time
#   bash bench/run_gpu.sh bench [names]    configure, build the benchmarks that have a GPU mode and the
#                                          levels demo, run them (names: a subset, e.g. bench_prefetch)
#   bash bench/run_gpu.sh peers [options]  configure, build peer_nitro, run bench/peers/compare.py on the
#                                          GPU against PyTorch eager (AMP), torch.compile and Lightning;
#                                          options go to compare.py (e.g. --rounds 2 --workloads mlp,cnn);
#                                          the results JSON lands in $OUT/results-gpu.json (plot_peers.py)
#
# Here, once:     bash bench/gpu_prepare.sh    (makes .gpu/: doctest, GSL, zlib, TurboJPEG and libpng for
#                 that machine, and the wheels of torchvision and Lightning, installed there offline)
# Device call:    command "bash bench/run_gpu.sh all", carry [".gpu"], timeout 600
# Each step prints its command, its exit code and its seconds; everything lands in $OUT/<step>.txt,
# and the call ends with a summary and the RESULT lines. `budget=N` (seconds, 570 for all, else 560) bounds each
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
  all | tests | bench | peers) shift ;;
  *) echo "usage: bash bench/run_gpu.sh all | tests | bench [benchmark names...] | peers [compare.py options]" >&2; exit 2 ;;
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
# The carried wheels (bench/gpu_prepare.sh): torchvision and Lightning for this Python, installed
# offline only where the machine lacks them (its image has both, as of 2026-11), after its own packages.
if ls .gpu/wheels/*.whl >/dev/null 2>&1 && [ "$part" != tests ] &&
  ! "$python" -c 'import torchvision, lightning' >/dev/null 2>&1; then
  site=$PWD/build-gpu/pysite
  if [ ! -d "$site" ]; then
    mkdir -p "$site"
    tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    wheels=()
    for w in .gpu/wheels/*.whl; do
      case "$w" in *-cp3*) case "$w" in *"-$tag-"*) wheels+=("$w") ;; esac ;; *) wheels+=("$w") ;; esac
    done
    "$python" -m pip install --disable-pip-version-check -q --no-index --no-deps --target "$site" "${wheels[@]}" ||
      echo "run_gpu: the carried wheels did not install (see above): no torchvision or Lightning rows"
  fi
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
fi

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
  if [ "$part" != tests ]; then
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

# In the order a call cut short by its budget should keep: the open goals first.
default_benches=(bench_jpeg_pipeline bench_checkpoint bench_prefetch bench_pipeline bench_monitor bench_autotune
  bench_loop_overhead bench_graphs bench_optimizer bench_images bench_batch_finder)
test_programs=(test_core test_hw test_data test_train test_memory test_monitor test_io test_snapshot test_optim test_graph
  test_dist test_cache test_image)

run_benches() { # names...: each gets at most what is left of `limit` (seconds since the call began)
  local limit=$1 b left
  shift
  for b in "$@" levels; do
    left=$(( limit - (SECONDS - start) ))
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
}

run_peers() { # seconds left for them, compare.py options...
  local left=$1 device
  shift
  if [ "$left" -lt 60 ]; then echo "run_gpu: ${left} s left: peers not started"; return; fi
  device=$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
  # SIGTERM from timeout makes compare.py summarise the runs it completed (never nothing); --deadline
  # starts no run it cannot finish, in the order the goals need them.
  step peers timeout "$left" "$python" bench/peers/compare.py --device "$device" --build build-gpu --python "$python" \
    --timeout 240 --deadline $(( left - 15 )) --out "$out/results-gpu.json" "$@"
}

# The reference tests (Python's GradScaler on the same GPU) run with the machine's python3.
step configure cmake --preset gpu -DNITRO_PYTHON="$python" || finish
if [ "$part" = all ]; then
  # One build of everything the call runs: the longest step, done once with every core.
  step build cmake --build --preset gpu -j "$(nproc)" --target "${test_programs[@]}" "${default_benches[@]}" levels \
    peer_nitro nitro_peer_tracking || finish
  # Each part within what is left of the budget, so that the summary and the RESULT lines always print.
  left=$(( ${budget:-570} - (SECONDS - start) ))
  step tests timeout $(( left < ${tests_s:-90} ? left : ${tests_s:-90} )) ctest --preset gpu -L gpu --timeout 120
  limit=$(( SECONDS - start + ${bench_s:-170} )); cap=$(( ${budget:-570} - 90 ))
  run_benches $(( limit < cap ? limit : cap )) "${default_benches[@]}"
  run_peers $(( ${budget:-570} - (SECONDS - start) )) --rounds 1 --workloads resnet50,gpt2 "$@"
elif [ "$part" = tests ]; then
  step build cmake --build --preset gpu -j "$(nproc)" --target "${test_programs[@]}" || finish
  # One at a time: they share the one GPU, and several time what the device does. Bounded by what is
  # left of the call's budget, so the summary always prints.
  step tests timeout $(( ${budget:-560} - (SECONDS - start) )) ctest --preset gpu -L gpu --timeout 300
elif [ "$part" = peers ]; then
  step build cmake --build --preset gpu -j "$(nproc)" --target peer_nitro nitro_peer_tracking || finish
  run_peers $(( ${budget:-560} - (SECONDS - start) )) "$@"
else
  benches=("$@")
  [ ${#benches[@]} -gt 0 ] || benches=("${default_benches[@]}")
  step build cmake --build --preset gpu -j "$(nproc)" --target "${benches[@]}" levels || finish
  # Each program gets at most what is left of the call's budget (`budget` s, default 560, under the
  # device's 600), so the call always ends with its summary rather than being cut off.
  run_benches "${budget:-560}" "${benches[@]}"
fi
finish
