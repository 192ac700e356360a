#!/usr/bin/env python3
"""Turns every ```cpp block of the README and docs/ into C++ that the build compiles.

    python3 tests/docs/snippets.py --out FILE.cpp [--programs DIR] MARKDOWN...

A block is one of:
  - a complete program (it has `int main(`): compiled as it stands, in FILE.cpp, its `main` renamed
    and its code in a namespace of its own; with `<!-- snippet: run ARGS... -->` on the line before
    the block it is also written to DIR/<file>_<line>.cpp, which the build makes an executable and
    CTest runs (docs.run.<file>_<line>);
  - a fragment, compiled inside a frame named on the line before the block:
      <!-- snippet: frame=body -->       (the default) the statements of a function's body, which
                                          sees the names of tests/docs/frame.hpp's Frame: `model`,
                                          `optimizer`, `loss_fn`, `batch`, `loader`, ...
      <!-- snippet: frame=namespace -->  declarations at namespace scope (structs, functions)
      <!-- snippet: frame=module -->     members of a torch::nn::Module (Frame's module members)
  and `cuda` among the options: compiled only where LibTorch has CUDA (NITRO_WITH_CUDA).
Every `#include` line of every block goes to the top of FILE.cpp; `#line` directives make a compile
error name the Markdown file and line. A block that must not be compiled is not C++: mark it ```text.
Fences of backticks or tildes (three or more) and the languages cpp, c++, cxx, cc, hpp in any case count.
"""
import argparse
import os
import re
import sys

FENCE = re.compile(r"^( {0,3}|\s*)(`{3,}|~{3,})\s*([^\s`{]*)(.*)$")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$")
INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"].*[>\"]")
MAIN = re.compile(r"\bint\s+main\s*\(")
CPP = {"cpp", "c++", "cxx", "cc", "hpp"}


def without_comments(text):
    """C++ text without its comments and string literals (to look for `int main(` in code only)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', " ", text, flags=re.S)


def blocks(path):
    """(first code line number, code lines, marker options) of each C++ block of a Markdown file.

    Fences as CommonMark has them: three or more backticks or tildes, closed by a fence of the same
    character at least as long; the language is the info string's first word (cpp, c++, cxx, cc, hpp,
    any case; attributes after it are ignored)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(4)):
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        close = re.compile(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if j == len(lines):
            sys.exit(f"{path}:{i + 1}: a fenced block that never ends")
        if lang in CPP:
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = MARKER.match(lines[k]) if k >= 0 else None
            options = marker.group(1).split() if marker else []
            code = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:j]]
            out.append((i + 2, code, options))
        i = j + 1
    return out


def parse_options(path, line, options):
    frame, run, args, cuda = "body", False, [], False
    for o in options:
        if o.startswith("frame="):
            frame = o.split("=", 1)[1]
        elif o == "cuda" and not run:
            cuda = True
        elif o == "run":
            run = True
        elif run:
            args.append(o)
        else:
            sys.exit(f"{path}:{line}: unknown snippet option {o!r} (frame=body|namespace|module, cuda, run ARGS...)")
    if frame not in ("body", "namespace", "module"):
        sys.exit(f"{path}:{line}: unknown frame {frame!r} (body, namespace, module)")
    return frame, run, args, cuda


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--programs", help="folder for the programs marked `run`")
    ap.add_argument("--root", default=os.getcwd(), help="paths in #line are relative to this folder")
    ap.add_argument("markdown", nargs="+")
    a = ap.parse_args()

    includes, bodies, programs, count = [], [], [], 0
    for path in a.markdown:
        rel = os.path.relpath(path, a.root)
        for line, code, options in blocks(path):
            count += 1
            frame, run, args, cuda = parse_options(rel, line, options)
            kept = []
            for text in code:
                if INCLUDE.match(text):
                    if text.strip() not in includes:
                        includes.append(text.strip())
                    kept.append("")  # keeps the line numbers
                else:
                    kept.append(text)
            name = f"snippet_{count}"
            where = f'#line {line} "{rel}"'
            text = "\n".join(kept)
            before = len(bodies)
            if MAIN.search(without_comments(text)):
                bodies.append(f"namespace {name} {{\n{where}\n{MAIN.sub('int program_main(', text, count=1)}\n}}  // namespace {name}\n")
                if run:
                    if not a.programs:
                        sys.exit(f"{rel}:{line}: a program marked run, but no --programs folder")
                    stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.splitext(rel)[0]).strip("_").lower()
                    programs.append((f"{stem}_{line}", "\n".join(code), args))
            elif run:
                sys.exit(f"{rel}:{line}: only a complete program (with int main) can be marked run")
            elif frame == "namespace":
                bodies.append(f"namespace {name} {{\nusing namespace nitro_docs;\n{where}\n{text}\n}}  // namespace {name}\n")
            elif frame == "module":
                bodies.append(f"namespace {name} {{\nstruct Snippet : nitro_docs::ModuleFrame {{\n{where}\n{text}\n}};\n}}  // namespace {name}\n")
            else:
                bodies.append(f"namespace {name} {{\nstruct Snippet : nitro_docs::Frame {{\n  int body() {{\n{where}\n{text}\n    return 0;\n  }}\n}};\n}}  // namespace {name}\n")
            if cuda:  # needs a LibTorch with CUDA (graph/capture.hpp's types): compiled where it has one
                bodies[before] = "#if NITRO_WITH_CUDA\n" + bodies[before] + "#endif\n"

    header = ["// Generated by tests/docs/snippets.py from the ```cpp blocks of the README and docs/: do not edit.",
              *includes, '#include "frame.hpp"', ""]
    text = "\n".join(header) + "\n".join(bodies)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    old = open(a.out, encoding="utf-8").read() if os.path.exists(a.out) else None
    if old != text:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    if a.programs:
        os.makedirs(a.programs, exist_ok=True)
        listing = []
        for stem, code, args in programs:
            path = os.path.join(a.programs, stem + ".cpp")
            body = code + "\n"
            if not os.path.exists(path) or open(path, encoding="utf-8").read() != body:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(body)
            listing.append(stem + "|" + " ".join(args))
        with open(os.path.join(a.programs, "programs.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(listing) + ("\n" if listing else ""))
    print(f"snippets: {count} blocks from {len(a.markdown)} files, {len(programs)} programs to run")


if __name__ == "__main__":
    main()
