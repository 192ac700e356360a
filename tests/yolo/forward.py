#!/usr/bin/env python3
"""examples/yolo's YOLOv8 (C++) against Ultralytics' model built from the same yaml, given the same
weights (random batch-norm statistics included) and input: the training forward's three maps and the
evaluation prediction (boxes and class probabilities), fp32 on the CPU, within 1e-5 (relative to the
largest magnitude of each output). Scales n and s, 80 and 3 classes, a non-square input.

  forward.py --program BUILD/tests/yolo_forward --work DIR
Prints "yolo forward: ok" when every comparison holds; exits 77 (skipped) without ultralytics.
"""
import argparse
import os
import subprocess
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "examples", "yolo"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    try:
        import ultralytics  # noqa: F401
    except ImportError:
        print("yolo forward: skipped: ultralytics is not installed (cmake/deps.sh installs it)")
        return 77
    import convert
    torch.set_num_threads(1)
    failures = 0
    for scale, classes, (n, h, w) in (("n", 80, (2, 96, 128)), ("s", 3, (1, 64, 96))):
        d = os.path.join(a.work, f"{scale}{classes}")
        model = convert.build(scale, classes, seed=0)
        convert.randomize_stats(model, seed=0)
        convert.write(model, d)
        x = torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(5))
        with open(os.path.join(d, "input.bin"), "wb") as f:
            f.write(x.numpy().tobytes())
        r = subprocess.run([a.program, d, scale, str(classes), str(n), str(h), str(w)], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        if r.returncode != 0:
            print(f"FAIL  yolov8{scale} ({classes} classes): yolo_forward: {r.stdout}{r.stderr}")
            failures += 1
            continue
        with torch.no_grad():
            model.eval()  # first, as yolo_forward: a training forward moves the running statistics
            want = {"predict": model(x)[0]}
            model.train()
            raw = model(x)  # {"boxes": [n, 64, anchors], "scores": [n, classes, anchors], "feats": the neck's maps}
            want["train boxes"], want["train scores"] = raw["boxes"], raw["scores"]
        # yolo_forward's training maps, [n, 64 + classes, h_i, w_i] a level, as the same two tensors.
        no = 64 + classes
        maps = []
        for i, f in enumerate(raw["feats"]):
            hw = f.shape[2] * f.shape[3]
            maps.append(torch.from_file(os.path.join(d, f"train_{i}.bin"), size=n * no * hw,
                                        dtype=torch.float32).view(n, no, hw))
        flat = torch.cat(maps, 2)
        mine = {"predict": torch.from_file(os.path.join(d, "predict.bin"), size=want["predict"].numel(),
                                           dtype=torch.float32).view_as(want["predict"]),
                "train boxes": flat[:, :64], "train scores": flat[:, 64:]}
        for key, ref in want.items():
            got = mine[key]
            err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
            ok = err <= 1e-5
            failures += not ok
            print(f"{'ok   ' if ok else 'FAIL '} yolov8{scale} ({classes} classes) {key} {tuple(ref.shape)}: "
                  f"max |diff| / max |ref| = {err:.2e}")
    if failures:
        print(f"yolo forward: {failures} comparison(s) failed")
        return 1
    print("yolo forward: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
