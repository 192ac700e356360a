#!/bin/sh
# A compiler launcher for checks that only parse (tests/CMakeLists.txt: the header self-containment
# check, the compile-fail checks): runs the compile command it is given with -fsyntax-only (the code
# is parsed and every template it defines checked, no code generated), then leaves an empty object
# file where the build expects one, so that the build tool sees the check done and runs it again
# only when its sources change.
#   syntax_only.sh [--with COMPILER] <compile command...>
# --with runs COMPILER (clang++, which parses faster) in place of the command's own compiler.
set -e
if [ "$1" = "--with" ]; then
  compiler=$2
  shift 3  # --with, COMPILER, and the command's own compiler
  set -- "$compiler" "$@"
fi
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
"$@" -fsyntax-only
[ -n "$out" ] && : >"$out"
