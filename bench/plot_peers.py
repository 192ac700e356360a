#!/usr/bin/env python3
"""Draws what bench/peers/compare.py measured (its --out JSON): throughput of every configuration of
every workload relative to the Python reference, the checkpoint workload's peak memory, and the
loss curves of the two sides.

  plot_peers.py results-cpu.json -o docs/peers-cpu.png     (also writes docs/peers-cpu-loss.png)
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NITRO_COLOUR, PYTHON_COLOUR, LIBTORCH_COLOUR = "#d62728", "#1f77b4", "#7f7f7f"


def colour(row):
    if row["side"] == "nitro":
        return LIBTORCH_COLOUR if row["config"] == "libtorch" else NITRO_COLOUR
    return PYTHON_COLOUR


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    with open(a.results) as f:
        data = json.load(f)
    m = data["machine"]
    where = m.get("gpu") or f"{m.get('cpu')}, {m.get('cores')} cores"
    title = (f"Nitro against PyTorch {m.get('torch')}" + (f" and Lightning {m['lightning']}" if m.get("lightning") else "")
             + f"\n{data['device']}: {where}; {m.get('date')}, commit {m.get('commit')}, median of {data['rounds']} rounds")
    summary = data["summary"]
    speed = [w for w in ("mlp", "cnn", "transformer", "pipeline") if w in summary]
    panels = speed + (["checkpoint"] if "checkpoint" in summary else [])
    if not panels:
        sys.exit("plot_peers: nothing to draw")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.2 + 1.5 * len(panels) + 0.25 * sum(
        len(summary[w]["rows"]) for w in panels)), squeeze=False)
    for ax, w in zip(axes[:, 0], panels):
        rows = [r for r in summary[w]["rows"] if not r.get("missing")]
        labels = [r["label"] for r in rows]
        if w == "checkpoint":
            values = [r["peak_mb"] for r in rows]
            ax.set_xlabel("peak activation memory of forward + backward, MB (lower is better)")
            text = [f"{v:.1f} MB" for v in values]
        else:
            values = [r["ratio"] for r in rows]
            ax.axvline(1.0, color="black", lw=0.8)
            ax.set_xlabel(f"samples/s relative to {summary[w]['reference']} (higher is better)")
            text = [f"{r['ratio']:.2f}  ({r['samples_per_s']:.0f}/s)" for r in rows]
        ys = range(len(rows))
        ax.barh(ys, values, color=[colour(r) for r in rows])
        ax.set_yticks(list(ys))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        for y, v, t in zip(ys, values, text):
            ax.text(v, y, " " + t, va="center", fontsize=8)
        ax.set_xlim(0, max(values) * 1.35 if values else 1)
        ax.set_title(w, fontsize=10, loc="left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    fig.savefig(a.output, dpi=110)
    print(f"plot_peers: wrote {a.output}")

    curves = [w for w in ("mlp", "cnn", "transformer") if w in summary]
    if curves:
        fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.6), squeeze=False)
        for ax, w in zip(axes[0], curves):
            for r in summary[w]["rows"]:
                if r.get("missing") or not r.get("losses"):
                    continue
                style = "-" if r["side"] == "nitro" else "--"
                ax.plot(range(1, len(r["losses"]) + 1), r["losses"], style, lw=1, label=r["config"], color=None)
            ax.set_title(f"{w}: loss per step", fontsize=10)
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        fig.suptitle("The same weights, data and order on both sides (Nitro solid, Python dashed)\n" + title.split("\n")[1],
                     fontsize=9)
        fig.tight_layout()
        loss_path = os.path.splitext(a.output)[0] + "-loss.png"
        fig.savefig(loss_path, dpi=110)
        print(f"plot_peers: wrote {loss_path}")


if __name__ == "__main__":
    main()
