#!/usr/bin/env bash
# Makes .gpu/ for the GPU round (bench/run_gpu.sh), here, where the package registries are:
#   1. ../shared/gpu/prepare.sh: doctest, GSL, zlib, TurboJPEG and libpng for the build there, and
#      libjpeg-turbo's libjpeg (Debian libjpeg62-turbo-dev), extracted beside them;
#   2. .gpu/wheels/: the wheels the Python rows of the comparison need, should that machine lack them
#      (its image has them as of 2026-11; it reaches no registry): torchvision (bench_jpeg_pipeline's
#      DataLoader row) and Lightning with the few packages it imports, at this machine's versions.
#      run_gpu.sh installs them there (--no-index --no-deps, into build-gpu/pysite) only if missing.
# NVIDIA DALI is not carried (over 400 MB; the carry holds 64 MiB in all).
#   bash bench/gpu_prepare.sh        then carry [".gpu"] in the device call
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=$(sed -n 's/^set(NITRO_PYTHON "\(.*\)" CACHE.*/\1/p' build/deps.cmake 2>/dev/null || true)
py=${py:-python3}
if [ -x ../shared/gpu/prepare.sh ] || [ -f ../shared/gpu/prepare.sh ]; then
  bash ../shared/gpu/prepare.sh
else
  echo "gpu_prepare: ../shared/gpu/prepare.sh not found: .gpu/ gets only the wheels" >&2
  mkdir -p .gpu
fi
# libjpeg-turbo's libjpeg API (jpeglib.h: the decoding of a crop's region), which prepare.sh predates.
(cd .gpu && mkdir -p debs root && cd debs && apt-get download libjpeg62-turbo-dev libjpeg62-turbo >/dev/null 2>&1 ||
  { apt-get update >/dev/null && apt-get download libjpeg62-turbo-dev libjpeg62-turbo; }) &&
  for f in .gpu/debs/libjpeg62-turbo*.deb; do dpkg -x "$f" .gpu/root; done
find .gpu/root -type l | while read -r link; do
  target=$(readlink "$link")
  case "$target" in /*) [ -e ".gpu/root$target" ] && ln -sfnr ".gpu/root$target" "$link" ;; esac
done
rm -rf .gpu/root/usr/share/doc .gpu/debs
# jpeglib.h includes "jconfig.h", which Debian keeps in the multiarch folder that env.sh's CPATH lacks.
[ -f .gpu/root/usr/include/x86_64-linux-gnu/jconfig.h ] && cp .gpu/root/usr/include/x86_64-linux-gnu/jconfig.h .gpu/root/usr/include/
version() { "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null || true; }
pins=()
for pkg in torchvision lightning lightning-utilities torchmetrics fsspec tqdm PyYAML packaging; do
  v=$(version "$pkg")
  case "$pkg" in
    torchvision) v=${v:-0.26.0} ;;  # the torchvision of torch 2.11
    lightning) v=${v:-2.6.6} ;;
  esac
  pins+=("$pkg${v:+==$v}")
done
rm -rf .gpu/wheels && mkdir -p .gpu/wheels
# The GPU machine's Python (3.12 as of 2026-11, /work/.library/device/KINDS.md; PYTHON_VERSIONS to change).
for pyv in ${PYTHON_VERSIONS:-3.12}; do
  "$py" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: --python-version "$pyv" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
    -d .gpu/wheels "${pins[@]}" || echo "gpu_prepare: no wheels for Python $pyv" >&2
done
ls -la .gpu/wheels
du -sh .gpu
