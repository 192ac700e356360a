#!/usr/bin/env python3
"""Writes docs/status.md: for each feature, its tests on the CPU and on a GPU, and its benchmarks' last
recorded results, counted from the test sources and read from bench/results/ (never typed by hand).

    python3 bench/status.py [--out FILE] [--check]

The tests of a feature are the doctest cases of its test files (tests/<area>/<file>.cpp); a case whose
name starts with "gpu:" needs a GPU (skipped elsewhere; `bash bench/run_gpu.sh tests` runs them).
The GPU machines a feature's benchmarks ran on are those of bench/results/<gpu>/. --check writes
nothing and exits 1 when FILE is not what the sources and results give.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_table  # noqa: E402  (bench/results_table.py: the recorded runs, read once)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (feature, guide, test files under tests/, the RESULT names that measure it)
FEATURES = [
    ("TrainingLoop and its policies (AMP, accumulation, clipping, hooks)", "levels.md",
     ["train/loop.cpp", "train/amp.cpp", "train/accumulate.cpp", "train/gpu.cpp", "train/two_models.cpp"],
     ["loop_overhead", "loop_overhead_instructions"]),
    ("Activation checkpointing", "porting.md#a-custom-module-and-activation-checkpointing",
     ["train/checkpoint.cpp"], ["checkpoint_memory", "checkpoint_time"]),
    ("Levels and level::Auto", "levels.md", ["train/autotune.cpp"],
     ["auto_dispatch_overhead", "autotune_vs_best_cnn", "autotune_vs_best_mlp"]),
    ("Fused optimizers, parameter groups, channels-last", "fast-step.md",
     ["optim/fused.cpp", "optim/groups.cpp"],
     ["fused_adamw_vs_libtorch_cpu", "fused_adamw_vs_libtorch_gpu"]),
    ("CUDA-graph capture (level::Max)", "fast-step.md#the-whole-step-as-a-cuda-graph", ["graph/capture.cpp"],
     ["graph_speedup_mlp", "graph_speedup_cnn"]),
    ("Prefetcher and sources", "data.md", ["data/prefetcher.cpp"],
     ["prefetch_vs_ideal_l20_c5_w4", "h2d_vs_peak", "overlap_ratio"]),
    ("Pipelines, record files, samplers", "data.md",
     ["data/pipeline.cpp", "data/record_file.cpp", "data/sampler.cpp"], ["recordfile_vs_torch_load"]),
    ("Batched augmentation", "data.md#batched-augmentation", ["data/augment.cpp"],
     ["batched_augment_speedup", "gpu_augment_overlap"]),
    ("Image decoding, ImageFolder, YOLO, packed files, nvJPEG", "images.md",
     ["image/decode.cpp", "image/folder.cpp", "image/packed.cpp", "image/nvjpeg.cpp"],
     ["decode_vs_pillow", "image_folder_vs_dataloader", "images_vs_dali_cpu", "packed_vs_folder",
      "draft_decode_speedup"]),
    ("Caches and eviction policies", "caches.md",
     ["cache/cache.cpp", "cache/evict.cpp", "cache/cached_dataset.cpp", "cache/disk_tier.cpp", "cache/trace.cpp"],
     ["epoch_best_vs_opt", "zipf_wtinylfu", "wtinylfu_vs_caffeine", "lru_get_speedup", "sharded_speedup"]),
    ("Snapshots and exact resume", "snapshots.md",
     ["snapshot/snapshot.cpp", "snapshot/policy.cpp", "snapshot/run.cpp"],
     ["snapshot_save_vs_torch_save", "snapshot_load_vs_torch_load"]),
    ("Several processes (DataParallel, samplers, preemption)", "distributed.md",
     ["dist/data_parallel.cpp", "dist/process_group.cpp", "dist/snapshot.cpp", "dist/preemption.cpp"],
     ["ddp_scaling_2proc", "ddp_overlap_speedup", "ddp_stop_vote_overhead"]),
    ("Monitoring, TensorBoard, traces", "monitoring.md",
     ["monitor/phases.cpp", "monitor/report.cpp", "monitor/progress.cpp", "monitor/sinks.cpp",
      "monitor/tensorboard.cpp", "monitor/trace.cpp"],
     ["monitor_overhead", "monitor_overhead_instructions", "tensorboard_overhead"]),
    ("Memory: tracking, the batch-size finder, the watch", "monitoring.md#memory-and-the-batch-size",
     ["memory/batch_size.cpp", "memory/monitor.cpp", "memory/tracking_allocator.cpp", "memory/oom.cpp",
      "memory/nvml.cpp"], ["batch_finder_trials", "batch_finder_exact"]),
    ("Stability guard and EMA", "monitoring.md", ["train/stability.cpp", "train/ema.cpp"], ["guard_overhead"]),
    ("Serving (folding, int8, compiled models, the batcher)", "serving.md",
     ["infer/fold.cpp", "infer/quantize.cpp", "infer/batcher.cpp", "infer/compiled.cpp"],
     ["fold_speedup", "int8_linear_speedup", "batcher_throughput_vs_single"]),
    ("Hardware settings", "levels.md#hardware-settings", ["hw/settings.cpp"], []),
]

CASE = re.compile(r'TEST_CASE(?:_TEMPLATE|_FIXTURE)?\(\s*(?:[A-Za-z_][A-Za-z_0-9:]*\s*,\s*)?"((?:[^"\\]|\\.)*)"')


def count_cases(files):
    cpu = gpu = 0
    missing = []
    for name in files:
        path = os.path.join(ROOT, "tests", name)
        if not os.path.isfile(path):
            missing.append(name)
            continue
        for case in CASE.findall(open(path, encoding="utf-8").read()):
            if case.startswith("gpu:"):
                gpu += 1
            else:
                cpu += 1
    return cpu, gpu, missing


def load_results():
    """name -> list of (value, op, goal, verdict, machine, date), CPU runs first (results_table.load)."""
    out = {}
    for record in results_table.load(os.path.join(HERE, "results")):
        machine = record.get("machine") or {}
        gpus = machine.get("gpus") or []
        cpu = machine["cpu"] if results_table.known(machine.get("cpu")) else f"{machine.get('cpus', '?')} CPUs"
        where = f"{cpu} + {gpus[0].split(',')[0]}" if gpus else cpu
        for r in record.get("results", []):
            out.setdefault(r["name"], []).append((r["value"], r["op"], r["goal"], r["verdict"], where,
                                                  record.get("date", "")[:10]))
    return out


def page():
    results = load_results()
    lines = ["# Status of each feature", "",
             "Generated by `bench/status.py` (`make docs`) from the test sources (`tests/`) and the recorded",
             "benchmark runs (`bench/results/`); do not edit by hand. CPU tests run in every `make test`; GPU",
             "tests (named `gpu: ...`) are skipped without a GPU and run by `bash bench/run_gpu.sh tests`.",
             "Every benchmark run, with its machine and date: [benchmarks.md](benchmarks.md).", "",
             "| feature | CPU tests | GPU tests | benchmark results (machine, date) |",
             "| --- | --- | --- | --- |"]
    problems = []
    for feature, guide, files, names in FEATURES:
        cpu, gpu, missing = count_cases(files)
        problems += [f"{feature}: tests/{m} does not exist" for m in missing]
        measured = []
        for name in names:
            for value, op, goal, verdict, where, date in results.get(name, []):
                measured.append(f"`{name}` {results_table.value_text(value)} ({op} {results_table.value_text(goal)}, {verdict}; {where}, {date})")
        lines.append(f"| [{feature}]({guide}) | {cpu} | {gpu} | {'<br>'.join(measured) or 'none recorded'} |")
    return "\n".join(lines) + "\n", problems


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "status.md"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    text, problems = page()
    if problems:
        sys.exit("status.py: " + "; ".join(problems))
    if a.check:
        current = open(a.out).read() if os.path.isfile(a.out) else None
        if current != text:
            sys.exit(f"status.py: {a.out} is not what the tests and results give; run `make docs`")
        print("status.py: up to date")
        return
    with open(a.out, "w") as f:
        f.write(text)
    print(f"status.py: wrote {a.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
