#!/usr/bin/env python3
"""Writes the weights of a YOLOv8 model built from Ultralytics' yolov8<scale>.yaml (no download: the
weights are the yaml model's own initialisation, from --seed) as weights.txt and weights.bin, which
examples/yolo/weights.hpp loads into yolo::Detector by name.

  convert.py --scale n --classes 80 --seed 0 --out DIR [--random-stats]

--random-stats also gives every batch norm random running statistics (so that evaluation mode is
not the identity on them): what the tests compare with.
"""
import argparse
import os

import torch


def build(scale, classes, seed):
    from ultralytics.nn.tasks import DetectionModel
    torch.manual_seed(seed)
    return DetectionModel(f"yolov8{scale}.yaml", nc=classes, verbose=False)


def write(model, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "weights.txt"), "w") as index, open(os.path.join(out, "weights.bin"), "wb") as data:
        for name, t in model.state_dict().items():
            t = t.detach().cpu().contiguous()
            dtype = {torch.float32: "float32", torch.int64: "int64"}[t.dtype]
            index.write(" ".join([name, dtype, str(t.numel())] + [str(d) for d in t.shape]) + "\n")
            data.write(t.numpy().tobytes())


def randomize_stats(model, seed):
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="n")
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--random-stats", action="store_true")
    a = p.parse_args()
    model = build(a.scale, a.classes, a.seed)
    if a.random_stats:
        randomize_stats(model, a.seed)
    write(model, a.out)
    print(f"convert: yolov8{a.scale}, {a.classes} classes, {sum(p.numel() for p in model.parameters())} parameters -> {a.out}")


if __name__ == "__main__":
    main()
