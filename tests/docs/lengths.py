#!/usr/bin/env python3
"""The README stays short enough to read in ten minutes, the benchmarks' method too."""
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
limits = {"README.md": 300, "bench/README.md": 400}
bad = []
for name, limit in limits.items():
    with open(os.path.join(root, name), encoding="utf-8") as f:
        n = sum(1 for _ in f)
    print(f"{name}: {n} lines (at most {limit})")
    if n > limit:
        bad.append(name)
if bad:
    sys.exit("lengths: too long: " + ", ".join(bad))
print("lengths: ok")
