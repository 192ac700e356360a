#!/usr/bin/env bash
# The whole GPU round in one device call: configure the `gpu` preset, build, run every test (the GPU
# ones included) and every benchmark, and keep what they printed under $OUT.
#
# Here, once:     ../shared/gpu/prepare.sh          (makes .gpu/: doctest and GSL for that machine)
# Device command: bash bench/run_gpu.sh              (carry: [".gpu"])
#
# The GPU machine has CUDA, cuDNN, ninja and PyTorch (python3), and no package registry: LibTorch is
# the one inside its PyTorch; doctest and GSL come from the carried .gpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/build-gpu/out}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
else
  prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || { echo "run_gpu: python3 cannot import torch"; exit 1; }
  export CMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi
status=0
step() { # name command...: runs, tees its output to $out/<name>.txt, remembers a failure
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "=== $name failed ($rc)"; status=1; }
  return "$rc"
}
{ nvidia-smi; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
step configure cmake --preset gpu || exit 1
step build cmake --build --preset gpu -j "$(nproc)" || exit 1
step tests ctest --preset gpu -j 4
for b in build-gpu/bench/bench_*; do
  [ -x "$b" ] && step "$(basename "$b")" "$b"
done
step quickstart build-gpu/examples/quickstart --epochs 3
echo "=== RESULT lines"
grep -h '^RESULT ' "$out"/*.txt || echo "(no benchmark printed RESULT lines)"
exit $status
