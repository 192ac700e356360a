#!/usr/bin/env python3
"""The real models of the comparison with Python PyTorch against their references, on the CPU:

1. bench/peers/models.py's ResNet-50 against torchvision.models.resnet50: the same state_dict names and
   shapes (parameters and batch-norm buffers, in order), the same parameter count, and, given the same
   weights and buffers (random running statistics included), the same logits in training and in
   evaluation mode (bitwise: the same operations in the same order).
2. Nitro's C++ ResNet-50 and GPT-2 (bench/models/*.hpp, through `peer_nitro forward`) against the
   Python twins given the weights peer_nitro exported: the parameter names and shapes in order
   (meta.json), the full-size parameter counts (torchvision's resnet50, 25,557,032; nanoGPT's GPT-2
   with its vocabulary of 50304, 124,475,904) and the first batch's logits in both modes, bitwise (one
   thread on both sides: the same kernels reduce in the same order), and torchvision's given Nitro's weights.

  models.py --peer-nitro BUILD/bench/peer_nitro --work DIR
Prints "models: ok" when everything holds; torchvision missing skips part 1 and says so.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "bench", "peers"))
import models  # noqa: E402
import peer_torch  # noqa: E402

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def against_torchvision():
    try:
        import torchvision
    except ImportError:
        print("skip  torchvision is not installed: the twin is not compared with torchvision's resnet50")
        return
    torch.manual_seed(3)
    twin, ref = models.resnet50(), torchvision.models.resnet50()
    a, b = twin.state_dict(), ref.state_dict()
    check([(k, tuple(v.shape)) for k, v in a.items()] == [(k, tuple(v.shape)) for k, v in b.items()],
          "ResNet-50 twin: torchvision's state_dict names and shapes, in order")
    check([n for n, _ in twin.named_parameters()] == [n for n, _ in ref.named_parameters()],
          "ResNet-50 twin: torchvision's parameter order")
    count = sum(p.numel() for p in ref.parameters())
    check(sum(p.numel() for p in twin.parameters()) == count == 25557032,
          f"ResNet-50 twin: {count} parameters, as torchvision's")
    with torch.no_grad():  # random weights and running statistics, the same in both
        for k, v in b.items():
            if v.is_floating_point():
                v.copy_(torch.randn_like(v) * 0.1 + (1.0 if k.endswith("running_var") or k.endswith("bn1.weight") else 0.0))
                if k.endswith("running_var"):
                    v.abs_()
    twin.load_state_dict(b)
    x = torch.randn(2, 3, 96, 96)
    for training in (True, False):
        twin.train(training)
        ref.train(training)
        with torch.no_grad():
            check(torch.equal(twin(x), ref(x)), f"ResNet-50 twin: torchvision's logits, bitwise ({'train' if training else 'eval'} mode)")


def against_nitro(peer, work):
    try:
        import torchvision as tv
    except ImportError:
        tv = None
    for w in ("resnet50", "gpt2"):
        r = subprocess.run([peer, "export", "--workload", w, "--dir", work], capture_output=True, text=True)
        check(r.returncode == 0, f"peer_nitro export {w}" + ("" if r.returncode == 0 else ": " + r.stderr.strip()))
        r = subprocess.run([peer, "forward", "--workload", w, "--dir", work], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})  # one thread, as here
        check(r.returncode == 0, f"peer_nitro forward {w}" + ("" if r.returncode == 0 else ": " + r.stderr.strip()))
        if r.returncode != 0:
            continue
        counted = int(re.search(rf"PARAMS {w}=(\d+)", r.stdout).group(1))
        with open(os.path.join(work, w, "meta.json")) as f:
            meta = json.load(f)
        twin = peer_torch.make_model(meta)  # exits when the names or shapes differ from meta.json's
        check(True, f"{w}: Nitro's parameter names and shapes are the twin's, in order ({len(meta['params'])} tensors)")
        full = models.resnet50() if w == "resnet50" else models.GPT()
        expected = 25557032 if w == "resnet50" else 124475904
        check(counted == sum(p.numel() for p in full.parameters()) == expected,
              f"{w}: full size, Nitro {counted} parameters, the twin {sum(p.numel() for p in full.parameters())}")
        d = os.path.join(work, w)
        peer_torch.load_weights(twin, os.path.join(d, "params.bin"))
        x = peer_torch.load_raw(os.path.join(d, "x.bin"), peer_torch.DTYPES[meta["x"]["dtype"]], meta["x"]["shape"])
        first = x[:meta["batch"]]
        ref = None
        if w == "resnet50" and tv is not None:
            ref = tv.models.resnet50(num_classes=meta["classes"])
            peer_torch.load_weights(ref, os.path.join(d, "params.bin"))
        for mode in ("train", "eval"):
            twin.train(mode == "train")
            with torch.no_grad():
                mine = twin(first)
            theirs = peer_torch.load_raw(os.path.join(d, f"logits_{mode}.bin"), torch.float32, list(mine.shape))
            diff = (mine - theirs).abs().max().item()
            check(torch.equal(mine, theirs), f"{w}: Nitro's logits are the twin's, bitwise ({mode} mode; max |diff| {diff:.2e})")
            if ref is not None:  # the training pass moved the running statistics: one model for both passes
                ref.train(mode == "train")
                with torch.no_grad():
                    check(torch.equal(ref(first), theirs), f"resnet50: Nitro's logits are torchvision's, bitwise ({mode} mode)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-nitro", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)  # and OMP_NUM_THREADS=1 for peer_nitro: one reduction order on both sides
    against_torchvision()
    against_nitro(a.peer_nitro, a.work)
    if failures:
        print(f"models: {len(failures)} check(s) failed")
        return 1
    print("models: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
