#!/usr/bin/env bash
# Compile time of a user's translation unit: Nitro's against the same program with LibTorch alone.
#
#   bash bench/compile.sh [--rounds N] [--build DIR] [--only header,quickstart,dcgan,auto] [--include DIR]
#
# Each pair is compiled the way users build: the exact command CMake gives examples/quickstart.cpp in
# a release build (its -O level, include directories and defines, no precompiled header), taken from
# DIR/compile_commands.json (default: the first of build-release, build-ct-release, build that has
# one made with -O2 or -O3). The measure is the compiler's CPU time (user + sys of the g++ process
# and its children, from /usr/bin/time), not wall-clock time: on shared cores the wall clock counts
# other processes' work. The candidate and its baseline alternate (A B A B A B), the median of each
# is compared. The compiler's peak memory (maximum resident set) is printed beside it: it follows the
# work the compiler does (declarations parsed, templates instantiated) and, unlike CPU time, hardly
# moves with the load of the machine, so it shows a small change that the CPU times' noise hides.
#   header      #include <nitro/nitro.hpp> + <torch/torch.h> + an empty main,
#               against <torch/torch.h> + an empty main
#   quickstart  examples/quickstart.cpp against bench/compile/quickstart_torch.cpp
#   dcgan       examples/dcgan.cpp against bench/compile/dcgan_torch.cpp
#   auto        a small program training with level::Auto<Basic, Advanced> (train/autotune.hpp)
#               against the same program with level::Basic: what Auto adds to a translation unit
#               (RESULT compile_auto_vs_basic, goal <= 1.5, our own: a variant of two loop types)
# --include DIR compiles against another copy of Nitro's headers (DIR/nitro/...), e.g. a copy taken
# before a change, in place of this tree's include/.
# About 20 to 40 CPU seconds a compile: 6 to 10 minutes for all three pairs on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
rounds=3
build=""
only="header,quickstart,dcgan,auto"
include=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --include) include="$2"; shift 2 ;;
    *) echo "compile.sh: unknown option $1; use --rounds N, --build DIR, --only header,quickstart,dcgan,auto, --include DIR" >&2; exit 2 ;;
  esac
done
[ "$rounds" -ge 1 ] 2>/dev/null || { echo "compile.sh: --rounds must be a whole number >= 1" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "compile.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }

# The compile command of examples/quickstart.cpp, less its -o and -c arguments.
command_of() {  # <compile_commands.json>
  python3 - "$1" <<'PY'
import json, shlex, sys
for entry in json.load(open(sys.argv[1])):
    if entry["file"].endswith("examples/quickstart.cpp"):
        args = entry.get("arguments") or shlex.split(entry["command"])
        out, skip = [], False
        for a in args:
            if skip: skip = False; continue
            if a in ("-o", "-c"): skip = True; continue
            out.append(a)
        print(shlex.join(out))
        break
PY
}
cmd=""
for dir in ${build:-build-release build-ct-release build}; do
  db="$dir/compile_commands.json"
  [ -f "$db" ] || continue
  c=$(command_of "$db")
  if [ -n "$c" ] && { [ -n "$build" ] || grep -qE -- ' -O[23]( |$)' <<<"$c"; }; then cmd="$c"; break; fi
done
[ -n "$cmd" ] || { echo "compile.sh: no compile_commands.json with examples/quickstart.cpp built with -O2/-O3; configure one: cmake --preset release" >&2; exit 2; }
if [ -n "$include" ]; then
  [ -f "$include/nitro/nitro.hpp" ] || { echo "compile.sh: --include $include has no nitro/nitro.hpp" >&2; exit 2; }
  cmd=${cmd//"-I$root/include"/"-I$(cd "$include" && pwd)"}
fi
read -r -a compile <<<"$cmd"
grep -qE -- ' -O[23]( |$)' <<<"$cmd" || echo "compile.sh: warning: $dir is not an optimised build; users build with -O2/-O3"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include <torch/torch.h>\n\nint main() { return 0; }\n' >"$tmp/header_torch.cpp"
printf '#include <nitro/nitro.hpp>\n\n#include <torch/torch.h>\n\nint main() { return 0; }\n' >"$tmp/header_nitro.cpp"
# The auto pair: one program, its loop type level::Auto<Basic, Advanced> or level::Basic.
auto_program() {  # <include line> <loop type> <after the steps>
  cat <<CPP
#include <nitro/nitro.hpp>
$1
#include <torch/torch.h>

#include <cstdio>

int main() {
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::Functional(torch::relu), torch::nn::Linear(8, 2));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  using Loop = $2;
  Loop loop{model, optimizer};
  const auto batch = std::make_pair(torch::randn({8, 4}), torch::randint(0, 2, {8}));
  const auto loss = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
  for (int i = 0; i < 3; ++i) loop.step(batch, loss);
  $3
  return 0;
}
CPP
}
auto_program '#include <nitro/train/autotune.hpp>' 'nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced>' \
  'std::puts(loop.result().table().c_str());' >"$tmp/auto_nitro.cpp"
auto_program '' 'nitro::level::Basic' 'std::printf("%lld\n", static_cast<long long>(loop.optimizer_steps()));' >"$tmp/auto_basic.cpp"

# CPU seconds (user + sys) and peak memory in MB of one compile of <source> to an object file.
compile_once() {
  /usr/bin/time -f '%U %S %M' -o "$tmp/time" "${compile[@]}" -c "$1" -o "$tmp/out.o" 2>"$tmp/err" || {
    echo "compile.sh: $1 does not compile:" >&2; head -20 "$tmp/err" >&2; return 1; }
  awk '{printf "%.2f %.0f", $1 + $2, $3 / 1024}' "$tmp/time"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "compile.sh: CPU seconds (user + sys) per compile, $rounds interleaved rounds, median"
echo "machine: $(lscpu | grep 'Model name' | sed 's/ \{2,\}/ /g'), $(nproc) cores; $("${compile[0]}" --version | head -1)"
echo "command: $cmd -c FILE -o FILE.o"
results=()
pair() {  # <name> <nitro source> <torch source> [<result name> <goal> <label of a> <label of b>]
  local name="$1" a="$2" b="$3" result="${4:-compile_nitro_vs_torch_$1}" goal="${5:-1.15}" ta=() tb=() ma_=() mb_=() t m out
  case ",$only," in *",$name,"*) ;; *) return 0 ;; esac
  for f in "$a" "$b"; do
    if [ ! -f "$f" ]; then
      echo "$name: skipped, ${f#"$root"/} is missing"
      return 0
    fi
  done
  printf '%-11s %-44s %s\n' "$name" "${a#"$root"/}" "(${6:-nitro}: 'nitro' below)"
  printf '%-11s %-44s %s\n' "" "${b#"$root"/}" "(${7:-LibTorch only}: 'torch' below)"
  for ((r = 1; r <= rounds; ++r)); do
    out=$(compile_once "$a"); read -r t m <<<"$out"; ta+=("$t"); ma_+=("$m")
    out=$(compile_once "$b"); read -r t m <<<"$out"; tb+=("$t"); mb_+=("$m")
    printf '  round %d: nitro %7.2f s %5d MB   torch %7.2f s %5d MB\n' "$r" "${ta[-1]}" "${ma_[-1]}" "${tb[-1]}" "${mb_[-1]}"
  done
  local ma mb ratio verdict rss_a rss_b
  ma=$(median "${ta[@]}"); mb=$(median "${tb[@]}")
  rss_a=$(median "${ma_[@]}"); rss_b=$(median "${mb_[@]}")
  ratio=$(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.3f", a / b}')
  verdict=$(awk -v r="$ratio" -v g="$goal" 'BEGIN {print (r <= g) ? "PASS" : "MISS"}')
  printf '  median:  nitro %7.2f s %5d MB   torch %7.2f s %5d MB   ratio %s (peak memory %s)\n' "$ma" "$rss_a" "$mb" \
    "$rss_b" "$ratio" "$(awk -v a="$rss_a" -v b="$rss_b" 'BEGIN {printf "%.3f", a / b}')"
  results+=("RESULT $result=$ratio goal<=$goal $verdict")
}
pair header "$tmp/header_nitro.cpp" "$tmp/header_torch.cpp"
pair quickstart "$root/examples/quickstart.cpp" "$root/bench/compile/quickstart_torch.cpp"
pair dcgan "$root/examples/dcgan.cpp" "$root/bench/compile/dcgan_torch.cpp"
pair auto "$tmp/auto_nitro.cpp" "$tmp/auto_basic.cpp" compile_auto_vs_basic 1.5 "level::Auto<Basic, Advanced>" "level::Basic"
lscpu | grep 'Model name'
[ ${#results[@]} -eq 0 ] || printf '%s\n' "${results[@]}"
