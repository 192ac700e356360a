#!/usr/bin/env bash
# Builds Nitro's libFuzzer targets (one per reader of untrusted files) with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer, and runs each in turn for its share of SECONDS (default 60; SECONDS
# divided among the targets run, at least 10 s each), each from a copy of its corpus (the
# repository's corpus is not changed):
#   target           reader                                  seeds
#   snapshot_reader  snapshot/snapshot.hpp's Reader          the files at the top of tests/fuzz/corpus/
#                                                            (where tests/snapshot/snapshot.cpp loads them)
#   image_decode     data/image.hpp's JPEG and PNG decoding  tests/fuzz/corpus/image_decode/
#   packed_reader    data/packed.hpp's PackedFile            tests/fuzz/corpus/packed_reader/
#   record_reader    data/record_file.hpp's RecordFile       tests/fuzz/corpus/record_reader/
#   yolo_labels      data/image_folder.hpp's YOLO labels     tests/fuzz/corpus/yolo_labels/
# A target is rebuilt when its source, run.sh, input_file.hpp or a header under include/ is newer than it; the builds
# run FUZZ_JOBS at a time (default: the number of CPUs). Each target's log, corpus copy and findings
# (crash-*, leak-*, timeout-*, oom-*: the input that did it) go to build-fuzz/<target>/. Prints one
# line per target (runs, coverage, exit status) and exits non-zero if any target found something or
# failed to build, after running all the others. Needs clang (Debian's clang-14), the LibTorch that
# cmake/deps.sh installs, and TurboJPEG, libjpeg and libpng (libturbojpeg0-dev, libjpeg-dev, libpng-dev).
#   tests/fuzz/run.sh [SECONDS [TARGET]]
set -euo pipefail
cd "$(dirname "$0")/../.."
all_targets=(snapshot_reader image_decode packed_reader record_reader yolo_labels)
seconds=${1:-60}
if [ $# -ge 2 ]; then
  case " ${all_targets[*]} " in
    *" $2 "*) targets=("$2") ;;
    *) echo "fuzz: no target '$2'; the targets: ${all_targets[*]}" >&2; exit 2 ;;
  esac
else
  targets=("${all_targets[@]}")
fi
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
       -isystem "$torch/include/torch/csrc/api/include" -D_GLIBCXX_USE_CXX11_ABI=1
       -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
libs=(-L"$torch/lib" -Wl,-rpath,"$torch/lib" -ltorch_cpu -lc10)

# Per target: extra libraries, the largest input, and whether LeakSanitizer runs (each input, and at
# exit). The snapshot reader keeps it off, as before: it goes through LibTorch's serialisation, which
# is not instrumented and keeps some allocations on purpose. The other readers only allocate tensors
# (at::empty, from_blob) besides their own memory, and their runs report no LibTorch leak: on.
extra_libs() { case $1 in image_decode | yolo_labels) echo "-lturbojpeg -ljpeg -lpng" ;; esac; }
max_len() { case $1 in yolo_labels) echo 4096 ;; *) echo 16384 ;; esac; }
leaks() { case $1 in snapshot_reader) echo 0 ;; *) echo 1 ;; esac; }
seeds() {  # the seed files of $1, one a line
  if [ "$1" = snapshot_reader ]; then find tests/fuzz/corpus -maxdepth 1 -type f; else find "tests/fuzz/corpus/$1" -type f; fi
}

build() {  # leaves build-fuzz/<target>/build.failed where it fails
  local t=$1 bin=$out/$1/$1
  mkdir -p "$out/$t"
  rm -f "$out/$t/build.failed"
  if [ -x "$bin" ] && [ ! tests/fuzz/"$t".cpp -nt "$bin" ] && [ ! tests/fuzz/run.sh -nt "$bin" ] &&
     [ ! tests/fuzz/input_file.hpp -nt "$bin" ] &&
     [ -z "$(find include -newer "$bin" -name '*.hpp' | head -1)" ]; then
    return 0
  fi
  # shellcheck disable=SC2046
  if ! "$clangxx" "${flags[@]}" tests/fuzz/"$t".cpp "${libs[@]}" $(extra_libs "$t") -o "$bin.tmp" \
       >"$out/$t/build.log" 2>&1; then
    echo "fuzz: $t: the build failed:" >&2
    tail -40 "$out/$t/build.log" >&2
    touch "$out/$t/build.failed"
    return 1
  fi
  mv "$bin.tmp" "$bin"
}

start=$SECONDS
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  build "$t" &
done
wait
echo "fuzz: built ${#targets[@]} target(s) in $((SECONDS - start)) s"

share=$((seconds / ${#targets[@]}))
[ "$share" -ge 10 ] || share=10
summary=()
status=0
for t in "${targets[@]}"; do
  dir=$out/$t
  if [ -e "$dir/build.failed" ]; then  # the others still run
    status=1
    summary+=("fuzz: $t: the build failed (build-fuzz/$t/build.log); not run")
    continue
  fi
  rm -rf "$dir/corpus" && mkdir -p "$dir/corpus"
  seeds "$t" | while read -r f; do cp "$f" "$dir/corpus/"; done
  touch "$dir/.started"
  set +e
  ASAN_OPTIONS=detect_leaks=$(leaks "$t"):allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$dir/$t" "$dir/corpus" -max_total_time="$share" -max_len="$(max_len "$t")" -rss_limit_mb=4096 \
    -timeout=10 -artifact_prefix="$dir/" -print_final_stats=1 >"$dir/fuzz.log" 2>&1
  s=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz.log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$dir/fuzz.log" | tail -1 || true)
  found=$(find "$dir" -maxdepth 1 -newer "$dir/.started" -type f \
            \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) | tr '\n' ' ')
  if [ "$s" != 0 ]; then
    status=1
    echo "fuzz: $t found something (exit status $s): the end of $dir/fuzz.log:"
    tail -40 "$dir/fuzz.log"
  fi
  summary+=("fuzz: $t: ${share} s, ${runs:-?} runs, ${cov:-cov: ?}, $(seeds "$t" | wc -l) seeds, leak detection $(leaks "$t"), exit status $s${found:+, $found}")
done
printf '%s\n' "${summary[@]}"
echo "fuzz: ${#targets[@]} target(s) in $((SECONDS - start)) s, exit status $status"
exit "$status"
