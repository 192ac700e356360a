#!/usr/bin/env bash
# The README's TensorBoard screenshot (docs/tensorboard.png), from the event files of the last
# `make demo`: starts the cached environment's tensorboard on them, photographs its Scalars
# dashboard with headless Chromium (Debian's `chromium`; apt-get install chromium), stops it.
#
#   bash bench/screenshot_tensorboard.sh [logdir] [png]
set -euo pipefail
logdir=${1:-build-release/demo-metrics/tensorboard}
png=${2:-docs/tensorboard.png}
py=$(sed -n 's/^set(NITRO_PYTHON "\(.*\)" CACHE.*/\1/p' build/deps.cmake 2>/dev/null || true)
tb=$(dirname "${py:-python3}")/tensorboard
[ -x "$tb" ] || tb=tensorboard
command -v chromium >/dev/null || { echo "screenshot_tensorboard: no chromium (apt-get install chromium)" >&2; exit 1; }
[ -d "$logdir" ] || { echo "screenshot_tensorboard: no $logdir (run make demo first)" >&2; exit 1; }
port=6017
"$tb" --logdir "$logdir" --port "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -fs "http://localhost:$port" >/dev/null 2>&1 && break; sleep 1; done
# The Scalars dashboard draws with SVG and canvas (the Time Series one needs WebGL, which headless
# Chromium draws blank); a tag filter shows loss, throughput and memory side by side.
chromium --headless=new --no-sandbox --use-angle=swiftshader --enable-unsafe-swiftshader --hide-scrollbars \
  --window-size=1400,900 --virtual-time-budget=20000 --screenshot="$png" \
  "http://localhost:$port/?darkMode=false#scalars&tagFilter=loss%7Csamples_per_s%7Cmemory_mib" 2>/dev/null
echo "wrote $png"
