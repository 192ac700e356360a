#!/usr/bin/env bash
# Compile time of a user's translation unit: Nitro's against the same program with LibTorch alone,
# header-only and with the compiled library.
#
#   bash bench/compile.sh [--rounds N] [--build DIR] [--only header,quickstart,dcgan,auto] [--include DIR]
#   bash bench/compile.sh --profile [--only header,dcgan] [--top N]
#
# Each pair is compiled the way users build: the exact command CMake gives examples/quickstart.cpp in
# a release build (its -O level, include directories and defines, no precompiled header), taken from
# DIR/compile_commands.json (default: the first of build-release, build-ct-release, build that has
# one made with -O2 or -O3). Nitro's program is compiled twice: header-only ('nitro'), and with
# -DNITRO_COMPILED=1 ('compiled': what linking nitro::compiled gives; its library is built once, not
# counted). The measure is the compiler's CPU time (user + sys of the g++ process and its children,
# from /usr/bin/time), not wall-clock time: on shared cores the wall clock counts other processes'
# work. The three alternate (A C B A C B ...), the median of each is compared. The compiler's peak
# memory (maximum resident set) is printed beside it: it follows the work the compiler does
# (declarations parsed, templates instantiated) and, unlike CPU time, hardly moves with the load of
# the machine, so it shows a small change that the CPU times' noise hides.
#   header      #include <nitro/nitro.hpp> + <torch/torch.h> + an empty main,
#               against <torch/torch.h> + an empty main
#   quickstart  examples/quickstart.cpp against bench/compile/quickstart_torch.cpp
#   dcgan       examples/dcgan.cpp against bench/compile/dcgan_torch.cpp
#   auto        a small program training with level::Auto<Basic, Advanced> (train/autotune.hpp)
#               against the same program with level::Basic: what Auto adds to a translation unit
# Goals (RESULT lines): header-only 1.15 (header), 1.10 (quickstart), 1.20 (dcgan), 1.20 (auto);
# compiled 1.05 (header, quickstart), 1.10 (dcgan).
# --include DIR compiles against another copy of Nitro's headers (DIR/nitro/...), e.g. a copy taken
# before a change, in place of this tree's include/.
# --profile prints where the time of the header and dcgan pairs goes instead: GCC's -ftime-report
# phases, and from clang's -ftime-trace (Debian's clang-14) the share of parsing Nitro's headers,
# instantiating templates and code generation, the costliest headers and instantiations
# (bench/compile_profile.py).
# About 20 to 40 CPU seconds a compile: 10 to 15 minutes for all four pairs on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
rounds=3
build=""
only="header,quickstart,dcgan,auto"
include=""
profile=0
top=15
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --include) include="$2"; shift 2 ;;
    --profile) profile=1; shift ;;
    --top) top="$2"; shift 2 ;;
    *) echo "compile.sh: unknown option $1; use --rounds N, --build DIR, --only header,quickstart,dcgan,auto, --include DIR, --profile, --top N" >&2; exit 2 ;;
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
            if a.startswith("-DNITRO_COMPILED"): continue  # the mode is chosen below, per column
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

# CPU seconds (user + sys) and peak memory in MB of one compile of <source> to an object file; extra
# compiler arguments after it (-DNITRO_COMPILED=1).
compile_once() {
  local source="$1"; shift
  /usr/bin/time -f '%U %S %M' -o "$tmp/time" "${compile[@]}" "$@" -c "$source" -o "$tmp/out.o" 2>"$tmp/err" || {
    echo "compile.sh: $source does not compile:" >&2; head -20 "$tmp/err" >&2; return 1; }
  awk '{printf "%.2f %.0f", $1 + $2, $3 / 1024}' "$tmp/time"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
ratio_of() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
verdict_of() { awk -v r="$1" -v g="$2" 'BEGIN {print (r <= g) ? "PASS" : "MISS"}'; }

echo "compile.sh: CPU seconds (user + sys) per compile, $rounds interleaved rounds, median"
echo "machine: $(lscpu | grep 'Model name' | sed 's/ \{2,\}/ /g'), $(nproc) cores; $("${compile[0]}" --version | head -1)"
echo "command: $cmd -c FILE -o FILE.o"
echo "nitro: header-only (nitro::nitro); compiled: the same source with -DNITRO_COMPILED=1 (nitro::compiled, whose"
echo "library is built once); torch: the program with LibTorch alone"
results=()
# <name> <nitro source> <torch source> <goal header-only> <goal compiled, or -> [<result name> <label a> <label b>]
pair() {
  local name="$1" a="$2" b="$3" goal="$4" goal_c="$5" result="${6:-compile_nitro_vs_torch_$1}"
  local ta=() tc=() tb=() ma_=() mc_=() mb_=() t m out
  case ",$only," in *",$name,"*) ;; *) return 0 ;; esac
  for f in "$a" "$b"; do
    if [ ! -f "$f" ]; then
      echo "$name: skipped, ${f#"$root"/} is missing"
      return 0
    fi
  done
  printf '%-11s %-44s %s\n' "$name" "${a#"$root"/}" "(${7:-nitro}: 'nitro' and 'compiled' below)"
  printf '%-11s %-44s %s\n' "" "${b#"$root"/}" "(${8:-LibTorch only}: 'torch' below)"
  for ((r = 1; r <= rounds; ++r)); do
    out=$(compile_once "$a"); read -r t m <<<"$out"; ta+=("$t"); ma_+=("$m")
    out=$(compile_once "$a" -DNITRO_COMPILED=1); read -r t m <<<"$out"; tc+=("$t"); mc_+=("$m")
    out=$(compile_once "$b"); read -r t m <<<"$out"; tb+=("$t"); mb_+=("$m")
    printf '  round %d: nitro %7.2f s %5d MB   compiled %7.2f s %5d MB   torch %7.2f s %5d MB\n' "$r" \
      "${ta[-1]}" "${ma_[-1]}" "${tc[-1]}" "${mc_[-1]}" "${tb[-1]}" "${mb_[-1]}"
  done
  local ma mc mb rss_a rss_c rss_b ratio ratio_c
  ma=$(median "${ta[@]}"); mc=$(median "${tc[@]}"); mb=$(median "${tb[@]}")
  rss_a=$(median "${ma_[@]}"); rss_c=$(median "${mc_[@]}"); rss_b=$(median "${mb_[@]}")
  ratio=$(ratio_of "$ma" "$mb"); ratio_c=$(ratio_of "$mc" "$mb")
  printf '  median:  nitro %7.2f s %5d MB   compiled %7.2f s %5d MB   torch %7.2f s %5d MB\n' "$ma" "$rss_a" "$mc" \
    "$rss_c" "$mb" "$rss_b"
  printf '  ratios:  nitro/torch %s (peak memory %s)   compiled/torch %s (peak memory %s)\n' "$ratio" \
    "$(ratio_of "$rss_a" "$rss_b")" "$ratio_c" "$(ratio_of "$rss_c" "$rss_b")"
  results+=("RESULT $result=$ratio goal<=$goal $(verdict_of "$ratio" "$goal")")
  if [ "$goal_c" != "-" ]; then
    local result_c=${result/compile_nitro_vs_torch_/compile_compiled_vs_torch_}
    [ "$result_c" = "$result" ] && result_c="${result}_compiled"
    results+=("RESULT $result_c=$ratio_c goal<=$goal_c $(verdict_of "$ratio_c" "$goal_c")")
  fi
}

# --profile: where the time of the header and dcgan pairs goes (GCC's -ftime-report, and clang's
# -ftime-trace where clang++ is installed), summarised by bench/compile_profile.py.
profile_pair() {  # <name> <nitro source> <torch source>
  local name="$1" a="$2" b="$3" dir="$tmp/profile-$1"
  case ",$only," in *",$name,"*) ;; *) return 0 ;; esac
  mkdir -p "$dir"
  echo
  echo "== profile: $name (${a#"$root"/} against ${b#"$root"/})"
  "${compile[@]}" -ftime-report -c "$a" -o "$dir/a.o" 2>"$dir/nitro.gcc.txt"
  "${compile[@]}" -DNITRO_COMPILED=1 -ftime-report -c "$a" -o "$dir/c.o" 2>"$dir/compiled.gcc.txt"
  "${compile[@]}" -ftime-report -c "$b" -o "$dir/b.o" 2>"$dir/torch.gcc.txt"
  python3 "$root/bench/compile_profile.py" --gcc "$dir/nitro.gcc.txt" "$dir/torch.gcc.txt" --labels nitro torch
  python3 "$root/bench/compile_profile.py" --gcc "$dir/compiled.gcc.txt" "$dir/torch.gcc.txt" --labels compiled torch
  local clang
  clang=$(command -v clang++-14 || command -v clang++ || true)
  if [ -z "$clang" ]; then
    echo "(clang++ not found: no -ftime-trace summary; apt-get install clang-14)"
    return 0
  fi
  local c=("$clang" "${compile[@]:1}")
  "${c[@]}" -ftime-trace -ftime-trace-granularity=10 -c "$a" -o "$dir/nitro.o" 2>/dev/null &&
    "${c[@]}" -DNITRO_COMPILED=1 -ftime-trace -ftime-trace-granularity=10 -c "$a" -o "$dir/compiled.o" 2>/dev/null &&
    "${c[@]}" -ftime-trace -ftime-trace-granularity=10 -c "$b" -o "$dir/torch.o" 2>/dev/null || {
      echo "(clang++ could not compile the pair: no -ftime-trace summary)"; return 0; }
  python3 "$root/bench/compile_profile.py" --clang "$dir/nitro.json" "$dir/torch.json" --root "$root/include" --top "$top"
  python3 "$root/bench/compile_profile.py" --clang "$dir/compiled.json" "$dir/torch.json" --labels compiled torch \
    --root "$root/include" --top "$top"
}

if [ "$profile" = 1 ]; then
  profile_pair header "$tmp/header_nitro.cpp" "$tmp/header_torch.cpp"
  profile_pair dcgan "$root/examples/dcgan.cpp" "$root/bench/compile/dcgan_torch.cpp"
  exit 0
fi

pair header "$tmp/header_nitro.cpp" "$tmp/header_torch.cpp" 1.15 1.05
pair quickstart "$root/examples/quickstart.cpp" "$root/bench/compile/quickstart_torch.cpp" 1.10 1.05
pair dcgan "$root/examples/dcgan.cpp" "$root/bench/compile/dcgan_torch.cpp" 1.20 1.10
pair auto "$tmp/auto_nitro.cpp" "$tmp/auto_basic.cpp" 1.20 - compile_auto_vs_basic "level::Auto<Basic, Advanced>" "level::Basic"
lscpu | grep 'Model name'
[ ${#results[@]} -eq 0 ] || printf '%s\n' "${results[@]}"
