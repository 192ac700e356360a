#!/usr/bin/env python3
"""Plot the metrics a nitro::monitor::JsonLinesSink wrote: loss, samples/s and memory against step.

    python3 bench/plot_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl -o metrics.png --title "a vs b"

Three stacked panels share the step axis: the loss (raw, faint, and a moving average), samples/s,
and memory in MB (memory_bytes solid, peak_memory_bytes dashed). One colour per input file,
labelled by the file's stem. null values are skipped. A line that does not parse after the first
(a crash cuts the last line short) is skipped with a warning.

Needs only the standard library and matplotlib (drawn with the Agg backend, no display).
Exit status: 0 drawn, 2 a file is missing or not JSON lines, or matplotlib is missing.
"""

import argparse
import json
import math
import sys
from pathlib import Path


def fail(message):
    print(f"plot_metrics.py: {message}", file=sys.stderr)
    sys.exit(2)


def read_rows(path):
    """The rows of one JSON-lines file, as dicts; exits with status 2 if it is not JSON lines."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path}: no such file; pass the .jsonl file a JsonLinesSink wrote")
    except (OSError, UnicodeDecodeError) as error:
        fail(f"{path}: cannot read it: {error}")
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("not an object with a \"step\"")
        except ValueError as error:
            if not rows:
                fail(f"{path}:{number}: not JSON lines as a JsonLinesSink writes "
                     f"({error}); the first line reads: {line[:80]!r}")
            print(f"plot_metrics.py: warning: {path}:{number}: skipped a line that does not parse "
                  f"(cut short by a crash?)", file=sys.stderr)
            continue
        rows.append(row)
    if not rows:
        fail(f"{path}: no rows; is it the file a JsonLinesSink wrote?")
    return rows


def number(value):
    """A finite float, or None for null and anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def series(rows, key, scale=1.0):
    """(steps, values) of the rows where `key` is a number."""
    steps, values = [], []
    for row in rows:
        step, value = number(row.get("step")), number(row.get(key))
        if step is not None and value is not None:
            steps.append(step)
            values.append(value * scale)
    return steps, values


def moving_average(values, window):
    """The mean of the last `window` values at each point (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by nitro::monitor::JsonLinesSink")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--title", default=None, help="a title above the panels")
    parser.add_argument("--window", type=int, default=20, help="points in the loss's moving average (20)")
    args = parser.parse_args(argv)
    if args.window < 1:
        fail("--window must be >= 1")

    runs = [(Path(f).stem, read_rows(f)) for f in args.files]

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(f"matplotlib is not installed for {sys.executable}; "
             f"install it with: {sys.executable} -m pip install matplotlib")

    figure, (loss_ax, rate_ax, memory_ax) = plt.subplots(3, 1, sharex=True, figsize=(10, 9))
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]

    # Runs often coincide (the same loss, the same memory): each run's line is drawn wider than the
    # next one's and carries its own markers at its own places, so a line hidden under another still
    # shows as a coloured band and by its markers.
    def style(index, points):
        every = max(len(runs), points // 8)  # each run's markers at its own offset in every stride
        offset = min(max(points - 1, 0), index * (every // len(runs)))
        return dict(color=colours[index % len(colours)], linewidth=max(1.2, 4.5 - 1.0 * index),
                    marker=markers[index % len(markers)], markersize=6,
                    markevery=(offset, every), zorder=3 + 0.01 * index)

    for index, (name, rows) in enumerate(runs):
        steps, loss = series(rows, "loss")
        if loss:
            # Raw values as faint dots of the run's colour (lines of several runs blend into mud).
            loss_ax.plot(steps, loss, linestyle="none", marker=".", markersize=3, alpha=0.35,
                         color=colours[index % len(colours)], zorder=2)
            loss_ax.plot(steps, moving_average(loss, args.window), label=name, **style(index, len(steps)))
        steps, rate = series(rows, "samples_per_s")
        if rate:
            rate_ax.plot(steps, rate, label=name, **style(index, len(steps)))
        steps, memory = series(rows, "memory_bytes", 1 / 1e6)
        if memory:
            memory_ax.plot(steps, memory, label=name, **style(index, len(steps)))
        steps, peak = series(rows, "peak_memory_bytes", 1 / 1e6)
        if peak:
            memory_ax.plot(steps, peak, linestyle="--", label=f"{name} peak", **style(index, len(steps)))

    loss_ax.set_ylabel(f"loss (dots: raw, line: mean of {args.window})")
    rate_ax.set_ylabel("samples/s")
    memory_ax.set_ylabel("memory MB (dashed: peak)")
    memory_ax.set_xlabel("step")
    for axis in (loss_ax, rate_ax, memory_ax):
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
        else:
            axis.text(0.5, 0.5, "no values", transform=axis.transAxes, ha="center", va="center", alpha=0.5)
    if args.title:
        figure.suptitle(args.title)
    figure.tight_layout()
    try:
        figure.savefig(args.output, format="png", dpi=100)
    except OSError as error:
        fail(f"cannot write {args.output}: {error}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
