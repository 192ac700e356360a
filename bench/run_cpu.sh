#!/usr/bin/env bash
# Nitro against what users run today, on this machine's CPU (bench/peers/README.md):
#
#   bash bench/run_cpu.sh [compare.py options, e.g. --rounds 5 --workloads mlp,cnn --skip compile]
#
# 1. the dependencies and a Release build of the C++ side (peer_nitro, libnitro_peer_tracking.so);
# 2. Lightning installed from PyPI into the benchmark environment (the Python that cmake/deps.sh found
#    or made, which imports the same torch as LibTorch's), torch pinned to the version already there;
# 3. bench/peers/compare.py: every workload's configurations alternately, `--rounds` rounds (default 3),
#    tables, RESULT lines, every run written to build-release/peers/results-cpu.json;
# 4. bench/plot_peers.py draws docs/peers-cpu.png and docs/peers-cpu-loss.png from it (matplotlib).
# About 8 minutes on 2 cores (2026-11-24), torch.compile's first compilations included; the first time
# also installs Lightning. With options (a subset), the plots go to build-release/peers/, not docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
make --no-print-directory configure PRESET=release
cmake --build --preset release -j "$jobs" --target peer_nitro nitro_peer_tracking
py=$(sed -n 's/^set(NITRO_PYTHON "\(.*\)" CACHE.*/\1/p' build/deps.cmake)
py=${py:-python3}
if ! "$py" -c "import lightning" 2>/dev/null; then
  torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
  echo "run_cpu: installing lightning into $("$py" -c 'import sys; print(sys.prefix)') (torch stays $torch_version)"
  "$py" -m pip install --disable-pip-version-check -q "lightning>=2.5,<3" "torch==$torch_version" ||
    echo "run_cpu: pip install lightning failed: the Lightning rows are left out"
fi
out=build-release/peers/results-cpu.json
mkdir -p build-release/peers
status=0
"$py" bench/peers/compare.py --device cpu --build build-release --python "$py" --out "$out" "$@" || status=$?
plot=docs/peers-cpu.png
[ $# -eq 0 ] || plot=build-release/peers/peers-cpu.png  # a subset run leaves the committed plots alone
if ! grep -q -- '--out' <<<"$*" && "$py" -c "import matplotlib" 2>/dev/null; then
  "$py" bench/plot_peers.py "$out" -o "$plot"
else
  echo "run_cpu: no plot drawn (matplotlib missing, or --out given: run bench/plot_peers.py on that file)"
fi
exit $status
