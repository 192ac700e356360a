#!/usr/bin/env python3
"""Where the compile time of a translation unit goes: a summary of clang's -ftime-trace files and of
GCC's -ftime-report, for a pair of programs (Nitro's, and the same with LibTorch alone).

    compile_profile.py --clang NITRO.json TORCH.json [--gcc NITRO.txt TORCH.txt] [--top N] [--root DIR]

bench/compile.sh --profile writes the files and calls this. For each pair it prints:
  - the phases (clang: parsing, template instantiation at the end of the translation unit, code
    generation; GCC: -ftime-report's phases), Nitro's translation unit against LibTorch's;
  - the share of what Nitro adds that is parsing Nitro's own headers, parsing LibTorch headers that
    only Nitro's include, instantiating Nitro's templates, instantiating others' templates (std::,
    c10::, torch::) from Nitro's code, and code generation;
  - the most expensive headers (time of each header's own text, the headers it includes left out),
    and the most expensive instantiations, grouped by template (arguments dropped).
The times are clang's or GCC's own wall-clock measures of one compile: compare the shares and the
rankings, which move little, more than the seconds, which move with the machine's load.
"""
import argparse
import collections
import json
import os
import re
import sys


def load_trace(path):
    with open(path) as f:
        data = json.load(f)
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]
    return events


def self_times(events, names):
    """Self time (microseconds) of each complete event whose name is in `names`: its duration less that
    of the same-thread events of those names directly nested in it. Returns [(event, self_us)]."""
    chosen = sorted((e for e in events if e["name"] in names), key=lambda e: (e.get("tid", 0), e["ts"], -e["dur"]))
    out = []
    stack = []  # (event, end, child_total)
    for e in chosen:
        end = e["ts"] + e["dur"]
        while stack and (stack[-1][0].get("tid", 0) != e.get("tid", 0) or stack[-1][1] <= e["ts"]):
            ev, _, child = stack.pop()
            out.append((ev, ev["dur"] - child))
        if stack:
            stack[-1][2] += e["dur"]
        stack.append([e, end, 0])
    while stack:
        ev, _, child = stack.pop()
        out.append((ev, ev["dur"] - child))
    return out


def template_name(detail):
    """'nitro::TrainingLoop<nitro::amp::Off, ...>::step<...>' -> 'nitro::TrainingLoop<>::step<>'."""
    out, depth = [], 0
    for ch in detail:
        if ch == "<":
            if depth == 0:
                out.append("<>")
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def owner(name):
    n = name.lstrip(":")
    if n.startswith("(anonymous namespace)"):
        return "program"
    for prefix, who in (("nitro::", "nitro"), ("std::", "std"), ("__gnu_cxx::", "std"), ("c10::", "libtorch"),
                        ("at::", "libtorch"), ("torch::", "libtorch"), ("caffe2::", "libtorch"),
                        ("gsl::", "gsl"), ("doctest::", "doctest")):
        if n.startswith(prefix):
            return who
    return "other"


def is_nitro_header(path, root):
    p = os.path.normpath(path)
    if root is not None:
        return p.startswith(os.path.normpath(root) + os.sep)
    return "/include/nitro/" in p


class Trace:
    def __init__(self, path, root):
        self.path = path
        events = load_trace(path)
        totals = {e["name"][len("Total "):]: e["dur"] for e in events if e["name"].startswith("Total ")}
        self.totals = totals
        self.events = [e for e in events if not e["name"].startswith("Total ")]
        # Self times over headers and instantiations together: a header's own text is its Source event
        # less the headers it includes and the instantiations done while it was read, and an
        # instantiation's own time leaves out those it caused.
        kinds = {"InstantiateFunction", "InstantiateClass"}
        self.headers = collections.Counter()
        self.instantiations = collections.Counter()
        self.instantiation_count = collections.Counter()
        self.by_owner = collections.Counter()
        for e, t in self_times(self.events, kinds | {"Source"}):
            detail = e.get("args", {}).get("detail", "?")
            if e["name"] == "Source":
                self.headers[detail] += t
            else:
                name = template_name(detail)
                self.instantiations[name] += t
                self.instantiation_count[name] += 1
                self.by_owner[owner(name)] += t
        self.nitro_parse = sum(t for h, t in self.headers.items() if is_nitro_header(h, root))
        self.other_parse = sum(t for h, t in self.headers.items() if not is_nitro_header(h, root))
        # The main file's own text (the program) counts with neither.
        self.frontend = totals.get("Frontend", 0)
        self.backend = totals.get("Backend", 0)
        self.pending = totals.get("PerformPendingInstantiations", 0)
        self.total = totals.get("ExecuteCompiler", self.frontend + self.backend)


def seconds(us):
    return us / 1e6


def print_clang(a, b, top, label_a, label_b, root):
    print(f"clang -ftime-trace ({label_a}: {a.path}; {label_b}: {b.path})")
    print(f"  {'phase':46s} {label_a:>9s} {label_b:>9s} {'added':>8s}")
    rows = [
        ("whole compile", a.total, b.total),
        ("front end (parsing + instantiation)", a.frontend, b.frontend),
        ("  parsing: Nitro's headers (own text)", a.nitro_parse, b.nitro_parse),
        ("  parsing: other headers (own text)", a.other_parse, b.other_parse),
        ("  instantiating: nitro:: templates", a.by_owner["nitro"], b.by_owner["nitro"]),
        ("  instantiating: std:: templates", a.by_owner["std"], b.by_owner["std"]),
        ("  instantiating: LibTorch templates", a.by_owner["libtorch"], b.by_owner["libtorch"]),
        ("  instantiating: the program's, others", a.by_owner["program"] + a.by_owner["other"] + a.by_owner["gsl"],
         b.by_owner["program"] + b.by_owner["other"] + b.by_owner["gsl"]),
        ("  of which at the end of the unit", a.pending, b.pending),
        ("back end (code generation, optimisation)", a.backend, b.backend),
    ]
    for name, x, y in rows:
        print(f"  {name:46s} {seconds(x):8.2f}s {seconds(y):8.2f}s {seconds(x - y):+7.2f}s")
    added = a.total - b.total
    if added > 0:
        parts = [
            ("parsing Nitro's own headers", a.nitro_parse - b.nitro_parse),
            ("parsing LibTorch/std headers only Nitro includes", a.other_parse - b.other_parse),
            ("instantiating Nitro's templates", a.by_owner["nitro"] - b.by_owner["nitro"]),
            ("instantiating std::/LibTorch templates", (a.by_owner["std"] + a.by_owner["libtorch"])
             - (b.by_owner["std"] + b.by_owner["libtorch"])),
            ("code generation", a.backend - b.backend),
        ]
        print(f"  what Nitro adds, {seconds(added):.2f} s, by share:")
        for name, t in parts:
            print(f"    {name:50s} {seconds(t):+7.2f} s  {100.0 * t / added:5.1f} %")
    print(f"  the {top} headers whose own text costs most in {label_a} (Nitro's marked *):")
    for h, t in a.headers.most_common(top):
        mark = "*" if is_nitro_header(h, root) else " "
        short = re.sub(r".*/(include|site-packages)/", "", h)
        print(f"    {mark} {seconds(t):6.2f} s  {short}")
    print(f"  the {top} templates whose instantiations cost most in {label_a} (self time; count):")
    for name, t in a.instantiations.most_common(top):
        print(f"      {seconds(t):6.2f} s  {a.instantiation_count[name]:5d}  {name[:110]}")


GCC_PHASES = ("phase setup", "phase parsing", "phase lang. deferred", "phase opt and generate",
              "|name lookup", "|overload resolution", "template instantiation", "TOTAL")


def read_gcc(path):
    """-ftime-report's rows: name -> (user + sys seconds, GGC MB)."""
    rows = {}
    with open(path) as f:
        for line in f:
            if ":" not in line:
                continue
            name, rest = line.split(":", 1)
            name = name.strip()
            nums = re.findall(r"(\d+\.\d+)", rest)
            mem = re.search(r"(\d+(?:\.\d+)?)([kMG])\s*(?:\(|$)", rest.strip())
            if len(nums) < 3 or not mem:
                continue
            mb = float(mem.group(1)) * {"k": 1 / 1024, "M": 1.0, "G": 1024.0}[mem.group(2)]
            rows[name] = (float(nums[0]) + float(nums[1]), mb)
    return rows


def print_gcc(a_path, b_path, label_a, label_b):
    a, b = read_gcc(a_path), read_gcc(b_path)
    print(f"g++ -ftime-report ({label_a}: {a_path}; {label_b}: {b_path}); CPU seconds (user + sys), GGC memory")
    print(f"  {'phase':28s} {label_a:>9s} {label_b:>9s} {'added':>8s} {'GGC ' + label_a:>10s} {'GGC ' + label_b:>10s}")
    for name in GCC_PHASES:
        if name in a or name in b:
            x, mx = a.get(name, (0.0, 0.0))
            y, my = b.get(name, (0.0, 0.0))
            print(f"  {name:28s} {x:8.2f}s {y:8.2f}s {x - y:+7.2f}s {mx:8.0f}MB {my:8.0f}MB")
    if "TOTAL" in a and "TOTAL" in b and a["TOTAL"][0] > b["TOTAL"][0]:
        added = a["TOTAL"][0] - b["TOTAL"][0]
        print(f"  what Nitro adds, {added:.2f} s: parsing (with what it instantiates at once) "
              f"{100 * (a.get('phase parsing', (0, 0))[0] - b.get('phase parsing', (0, 0))[0]) / added:.0f} %, "
              f"templates instantiated at the end of the unit "
              f"{100 * (a.get('phase lang. deferred', (0, 0))[0] - b.get('phase lang. deferred', (0, 0))[0]) / added:.0f} %, "
              f"code generation {100 * (a.get('phase opt and generate', (0, 0))[0] - b.get('phase opt and generate', (0, 0))[0]) / added:.0f} %"
              f" (template instantiation in all: "
              f"{100 * (a.get('template instantiation', (0, 0))[0] - b.get('template instantiation', (0, 0))[0]) / added:.0f} %)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clang", nargs=2, metavar=("NITRO_JSON", "TORCH_JSON"))
    p.add_argument("--gcc", nargs=2, metavar=("NITRO_TXT", "TORCH_TXT"))
    p.add_argument("--labels", nargs=2, default=("nitro", "torch"))
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--root", default=None, help="Nitro's include directory (to tell its headers apart)")
    args = p.parse_args()
    if not args.clang and not args.gcc:
        p.error("give --clang and/or --gcc")
    if args.gcc:
        print_gcc(*args.gcc, *args.labels)
    if args.clang:
        print_clang(Trace(args.clang[0], args.root), Trace(args.clang[1], args.root), args.top, *args.labels, args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
