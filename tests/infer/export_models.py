"""Exports a tiny CNN for tests/infer/compiled.cpp: an AOTInductor package, a TorchScript file, an
input of batch 5 and the eager model's output for it (raw float32, C order).

    python export_models.py OUT_DIR
"""
import sys
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 4))
with torch.no_grad():  # running statistics away from their defaults, so folding them matters
    model[1].running_mean.copy_(torch.randn(8))
    model[1].running_var.copy_(torch.rand(8) + 0.5)
model.eval()
x = torch.randn(5, 3, 8, 8)
with torch.no_grad():
    expected = model(x)
x.numpy().tofile(out / "x.bin")
expected.numpy().tofile(out / "expected.bin")

# TorchScript (the legacy path): traced, saved.
torch.jit.save(torch.jit.trace(model, x[:2]), str(out / "cnn.ts"))

# AOTInductor (the primary path): exported with a dynamic batch dimension, compiled for the CPU.
batch = torch.export.Dim("batch", min=1, max=64)
ep = torch.export.export(model, (x[:2],), dynamic_shapes={"input": {0: batch}})
torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "cnn.pt2"))
print("exported", out)
