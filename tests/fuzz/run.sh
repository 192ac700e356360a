#!/usr/bin/env bash
# Builds the snapshot reader's libFuzzer target (tests/fuzz/snapshot_reader.cpp) with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs it for SECONDS (default 60) from the
# corpus in tests/fuzz/corpus (copied: the repository's corpus is not changed). Exits non-zero on a
# finding; the crashing input is left in build-fuzz/. Needs clang (Debian's clang-14) and the
# LibTorch that cmake/deps.sh installs.
#   tests/fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
clangxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$clangxx" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "fuzz: installing clang-14 (Debian)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-14 >/dev/null
  clangxx=$(command -v clang++-14 || true)
fi
if [ -z "$clangxx" ]; then
  echo "fuzz: clang++ not found; install clang-14 (apt-get install clang-14)" >&2
  exit 1
fi
deps=build/deps.cmake
[ -f "$deps" ] || cmake/deps.sh "$deps"
torch_cmake=$(sed -n 's/^set(CMAKE_PREFIX_PATH "\(.*\)" CACHE.*/\1/p' "$deps")
torch=$(cd "$torch_cmake/../.." && pwd)
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -DNITRO_WITH_CUDA=0 -Iinclude -isystem "$torch/include"
       -isystem "$torch/include/torch/csrc/api/include" -D_GLIBCXX_USE_CXX11_ABI=1)
libs=(-L"$torch/lib" -Wl,-rpath,"$torch/lib" -ltorch_cpu -lc10)
start=$SECONDS
if [ ! -x "$out/snapshot_reader" ] || [ tests/fuzz/snapshot_reader.cpp -nt "$out/snapshot_reader" ] ||
   [ -n "$(find include -newer "$out/snapshot_reader" -name '*.hpp' | head -1)" ]; then
  "$clangxx" "${flags[@]}" -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined tests/fuzz/snapshot_reader.cpp "${libs[@]}" -o "$out/snapshot_reader"
fi
echo "fuzz: built in $((SECONDS - start)) s"
rm -rf "$out/corpus" && cp -r tests/fuzz/corpus "$out/corpus"
# LibTorch itself is not instrumented: leaks it keeps on purpose are not findings.
set +e
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
  "$out/snapshot_reader" "$out/corpus" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=4096 \
  -timeout=10 -artifact_prefix="$out/" -print_final_stats=1 >"$out/fuzz.log" 2>&1
status=$?
set -e
tail -25 "$out/fuzz.log"
echo "fuzz: ran ${seconds} s on $(ls tests/fuzz/corpus | wc -l) seed files, exit status $status"
exit "$status"
