#!/usr/bin/env bash
# Finds or installs everything Nitro builds on, then writes a CMake initial-cache file (-C) that
# points the configure step at it. Called by the Makefile; run by hand only to print LibTorch's prefix.
#
#   cmake/deps.sh OUT.cmake [--with-conan]
#   cmake/deps.sh --print-prefix     finds (or installs) LibTorch only, as below, and prints its CMake
#                                    prefix on stdout (notes on stderr), for a project's own configure:
#                                    -DCMAKE_PREFIX_PATH="$(nitro/cmake/deps.sh --print-prefix)"
#
# LibTorch, first match wins:
#   1. Torch_DIR, or a CMAKE_PREFIX_PATH that holds a TorchConfig.cmake (the user's own LibTorch);
#   2. a python3 that can `import torch` (torch.utils.cmake_prefix_path);
#   3. the cached environment ${XDG_CACHE_HOME:-$HOME/.cache}/nitro/torch-<version>, shared by every
#      clone on the machine;
#   4. otherwise that environment is created and `pip install torch==<version>` runs into it once
#      (the CUDA 13.0 build, several GB).
# doctest and Microsoft GSL: found where CMake looks; else apt-get (as root); else one line saying
# what to run. Conan (for the packaging test) goes into a second cached environment.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: cmake/deps.sh OUT.cmake [--with-conan] | cmake/deps.sh --print-prefix}
print_prefix=0
[ "$out" = "--print-prefix" ] && print_prefix=1
with_conan=0
[ "${2:-}" = "--with-conan" ] && with_conan=1

torch_version=$(tr -d ' \n' <"$here/torch-version")   # the one place the version is pinned
conan_version=2.34.0
torchvision_version=0.26.0  # the torchvision of torch 2.11
ultralytics_version=8.4.190  # the reference of examples/yolo's tests
cache=${XDG_CACHE_HOME:-$HOME/.cache}/nitro
venv=$cache/torch-$torch_version
say() { echo "nitro deps: $*" >&2; }
die() { echo "nitro deps: error: $*" >&2; exit 1; }

python_prefix() { # python -> torch's cmake prefix, or nothing
  "$1" - 2>/dev/null <<'PY' || true
import warnings; warnings.filterwarnings("ignore")
import torch, torch.utils
print(torch.__version__.split("+")[0], torch.utils.cmake_prefix_path)
PY
}

make_venv() { # dir packages... : complete only once the marker file exists (venvs cannot be moved)
  local dir=$1; shift
  rm -rf "$dir"
  command -v python3 >/dev/null || die "python3 is missing; install it (as root: apt-get install -y python3 python3-venv)"
  python3 -m venv "$dir" || die "python3 -m venv failed; install venv support (as root: apt-get install -y python3-venv)"
  "$dir/bin/python" -m pip install --disable-pip-version-check --progress-bar on "$@" >&2 ||
    { rm -rf "$dir"; die "pip install $* failed (see above); nothing was left half-installed"; }
  touch "$dir/.nitro-complete"
}
venv_ok() { [ -f "$1/.nitro-complete" ]; }

# ---- LibTorch --------------------------------------------------------------------------------------
torch_prefix=""
torch_python=""  # a python with this torch, for the tests that compare with PyTorch
if [ -n "${Torch_DIR:-}" ]; then
  [ -f "$Torch_DIR/TorchConfig.cmake" ] || die "Torch_DIR=$Torch_DIR has no TorchConfig.cmake; point it at <libtorch>/share/cmake/Torch"
  torch_prefix=$(dirname "$Torch_DIR")
  say "LibTorch from Torch_DIR ($Torch_DIR)"
fi
if [ -z "$torch_prefix" ] && [ -n "${CMAKE_PREFIX_PATH:-}" ]; then
  IFS=':;' read -ra entries <<<"$CMAKE_PREFIX_PATH"
  for p in "${entries[@]}"; do
    if [ -n "$p" ] && find "$p" -maxdepth 4 -name TorchConfig.cmake 2>/dev/null | grep -q .; then
      torch_prefix=$CMAKE_PREFIX_PATH
      say "LibTorch from CMAKE_PREFIX_PATH ($p)"
      break
    fi
  done
fi
if [ -z "$torch_prefix" ] && command -v python3 >/dev/null; then
  read -r v p < <(python_prefix python3) || true
  if [ -n "${p:-}" ]; then
    torch_prefix=$p
    torch_python=$(command -v python3)
    [ "$v" = "$torch_version" ] || say "note: python3 has torch $v; Nitro is tested on $torch_version"
    say "LibTorch $v from python3 ($p)"
  fi
fi
if [ -z "$torch_prefix" ]; then
  v="" p=""
  venv_ok "$venv" && { read -r v p < <(python_prefix "$venv/bin/python") || true; }
  if [ -z "${p:-}" ]; then
    say "installing torch==$torch_version into $venv (once per machine; several GB)"
    mkdir -p "$cache"
    make_venv "$venv" "torch==$torch_version" numpy
    read -r v p < <(python_prefix "$venv/bin/python") || true
    [ -n "${p:-}" ] || die "torch was installed into $venv but does not import; remove $venv and run again"
  fi
  torch_prefix=$p
  torch_python=$venv/bin/python
  say "LibTorch $v from $venv"
  # matplotlib, for bench/plot_metrics.py (and its test): into our own environment only, and optional.
  if ((!print_prefix)) && ! "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
    say "installing matplotlib into $venv (for bench/plot_metrics.py)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q matplotlib >&2 ||
      say "note: pip install matplotlib failed; plot_metrics.py and its test will be skipped"
  fi
  # tensorboard, whose event reader checks monitor::TensorBoardSink's files (and views them): optional.
  if ((!print_prefix)) && ! "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
    say "installing tensorboard into $venv (to read monitor::TensorBoardSink's files)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q tensorboard >&2 ||
      say "note: pip install tensorboard failed; the TensorBoard read-back test will be skipped"
  fi
  # The image tests and bench_images: Pillow (the reference decoder), scikit-image's sample photographs
  # (only its data files are read: --no-deps) and torchvision's ImageFolder and DataLoader side (--no-deps,
  # so it cannot replace this torch). Optional: without them those tests say so and skip.
  if ((!print_prefix)) && ! "$venv/bin/python" -c "import PIL" 2>/dev/null; then
    say "installing pillow into $venv (the reference for the image decoding tests)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q pillow >&2 ||
      say "note: pip install pillow failed; the image tests that compare with Pillow will be skipped"
  fi
  if ((!print_prefix)) && ! "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('skimage') is None or u.find_spec('torchvision') is None)" 2>/dev/null; then
    say "installing scikit-image and torchvision==$torchvision_version (--no-deps) into $venv (image tests, bench_images)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps scikit-image "torchvision==$torchvision_version" >&2 ||
      say "note: pip install scikit-image torchvision failed; the tests that need them will be skipped"
  fi
  # Ultralytics, the reference of examples/yolo's YOLOv8 (tests/yolo): the model built from its yaml, no
  # weights downloaded. --no-deps with what building a model imports (OpenCV headless, PyYAML, tqdm),
  # so that it cannot replace this torch. Optional: without it those tests say so and skip.
  if ((!print_prefix)) && ! "$venv/bin/python" -c "import ultralytics, cv2, yaml, tqdm" 2>/dev/null; then
    say "installing ultralytics==$ultralytics_version (--no-deps) into $venv (the reference of examples/yolo's tests)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "ultralytics==$ultralytics_version" \
      opencv-python-headless pyyaml tqdm >&2 ||
      say "note: pip install ultralytics failed; the tests that compare with it will be skipped"
  fi
fi

if ((print_prefix)); then
  echo "${torch_prefix//:/;}"  # a CMake list: the caller puts it after its own entries and a ';'
  exit 0
fi

# torchrun, the launcher of runs of several processes (README, "More than one process").
if [ -n "$torch_python" ] && [ -x "$(dirname "$torch_python")/torchrun" ]; then
  say "torchrun: $(dirname "$torch_python")/torchrun"
fi

# ---- doctest, GSL, zlib, TurboJPEG, libjpeg, libpng ----------------------------------------------------------------------
have_config() { # package config file name -> found in the usual prefixes?
  local roots=(/usr /usr/local)
  [ -n "${CMAKE_PREFIX_PATH:-}" ] && IFS=':;' read -ra extra <<<"$CMAKE_PREFIX_PATH" && roots+=("${extra[@]}")
  for r in "${roots[@]}"; do
    [ -n "$r" ] && find "$r/lib" "$r/share" "$r/lib64" -maxdepth 4 -name "$1" 2>/dev/null | grep -q . && return 0
  done
  return 1
}
missing=()
have_config doctestConfig.cmake || missing+=(doctest-dev)
have_config Microsoft.GSLConfig.cmake || missing+=(libmsgsl-dev)
# zlib: the cache benchmarks and their tests read gzip traces (not needed by Nitro's headers).
[ -e /usr/include/zlib.h ] || [ -e /usr/local/include/zlib.h ] || missing+=(zlib1g-dev)
# TurboJPEG, libjpeg and libpng: nitro::image (include/nitro/data/image.hpp) decodes JPEG and PNG files with them.
[ -e /usr/include/turbojpeg.h ] || [ -e /usr/local/include/turbojpeg.h ] || missing+=(libturbojpeg0-dev)
# libjpeg-turbo's libjpeg API too (jpeglib.h, libjpeg): decoding only a crop's region.
[ -e /usr/include/jpeglib.h ] || [ -e /usr/local/include/jpeglib.h ] || missing+=(libjpeg-dev)
[ -e /usr/include/png.h ] || [ -e /usr/local/include/png.h ] || missing+=(libpng-dev)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} with apt-get"
    apt-get install -y "${missing[@]}" >&2 ||
      { apt-get update >&2 && apt-get install -y "${missing[@]}" >&2; } ||
      die "apt-get could not install ${missing[*]}"
  else
    die "missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
  fi
fi

# Doxygen, for `make docs` only (the API reference from the headers' /// comments): installed as root,
# else one line saying how; nothing else needs it.
if ! command -v doxygen >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing doxygen with apt-get (for make docs)"
    apt-get install -y doxygen >&2 || { apt-get update >&2 && apt-get install -y doxygen >&2; } ||
      say "apt-get could not install doxygen; make docs will not make the API reference"
  else
    say "doxygen is missing: make docs needs it (sudo apt-get install -y doxygen)"
  fi
fi

# ---- gloo's headers, for nitro::dist (declarations only; see include/nitro/dist/process_group.hpp) -----
# Debian's libgloo-dev, unpacked into the cache: nothing installed, nothing linked (libtorch_cpu carries
# its own gloo). Without them nitro::dist has no Gloo groups, and the tests that need one are skipped.
gloo_include=""
if [ -e /usr/include/gloo/rendezvous/store.h ]; then
  gloo_include=/usr/include
else
  gloo_cache=$cache/gloo-headers
  if [ ! -f "$gloo_cache/.nitro-complete" ] && command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
    say "fetching libgloo-dev's headers into $gloo_cache (apt-get download; nothing is installed)"
    rm -rf "$gloo_cache" && mkdir -p "$gloo_cache/deb"
    fetch_gloo() { (cd "$gloo_cache/deb" && apt-get download libgloo-dev >&2 2>/dev/null); }
    if fetch_gloo || { [ "$(id -u)" = 0 ] && apt-get update >&2 && fetch_gloo; }; then
      dpkg -x "$gloo_cache"/deb/libgloo-dev_*.deb "$gloo_cache/root" && touch "$gloo_cache/.nitro-complete"
    fi
    [ -f "$gloo_cache/.nitro-complete" ] || say "note: could not fetch libgloo-dev; nitro::dist will have no Gloo groups"
  fi
  [ -f "$gloo_cache/.nitro-complete" ] && gloo_include=$gloo_cache/root/usr/include
fi

# ---- Conan (packaging test only) -------------------------------------------------------------------
conan=""
if ((with_conan)); then
  tools=$cache/conan-$conan_version
  if ! venv_ok "$tools" || ! "$tools/bin/conan" --version >/dev/null 2>&1; then
    say "installing conan==$conan_version into $tools"
    mkdir -p "$cache"
    make_venv "$tools" "conan==$conan_version"
  fi
  conan=$tools/bin/conan
fi

mkdir -p "$(dirname "$out")"
{
  echo "# written by cmake/deps.sh; do not edit"
  echo "set(CMAKE_PREFIX_PATH \"$torch_prefix\" CACHE STRING \"\" FORCE)"
  [ -n "$gloo_include" ] && echo "set(NITRO_GLOO_INCLUDE_DIR \"$gloo_include\" CACHE PATH \"gloo's headers (declarations only)\" FORCE)"
  [ -n "$conan" ] && echo "set(NITRO_CONAN \"$conan\" CACHE FILEPATH \"\" FORCE)"
  echo "set(NITRO_PYTHON \"$torch_python\" CACHE FILEPATH \"a python that imports the same torch (reference tests)\" FORCE)"
} >"$out.tmp" && mv "$out.tmp" "$out"
say "ready ($out)"
