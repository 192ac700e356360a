#!/bin/sh
# A compiler launcher for the header self-containment check (tests/CMakeLists.txt): runs the compile
# command it is given with -fsyntax-only (the header is parsed and every template it defines checked,
# no code generated), then leaves an empty object file where the build expects one, so that the
# build tool sees the check done and runs it again only when the header changes.
set -e
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
"$@" -fsyntax-only
[ -n "$out" ] && : >"$out"
