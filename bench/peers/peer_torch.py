#!/usr/bin/env python3
"""The Python side of the comparison (bench/peers/README.md): the workloads of peer_nitro.cpp written
the way a good PyTorch user writes them, one configuration per process, printing the same
`PEER {json}` line.

  peer_torch.py --workload W --config C --dir D [--device cpu|cuda] [--steps N] [--warmup K]
                [--tracking path/to/libnitro_peer_tracking.so]

  W: mlp | cnn | transformer | resnet50 | gpt2
                               C: eager     fp32, AdamW(fused=True) (ResNet-50: SGD(fused=True), momentum),
                                            zero_grad(set_to_none=True)
                                  amp       autocast bf16 (GPU), the same optimizer
                                  amp_fp16  autocast fp16 + torch.amp.GradScaler (GPU)
                                  compile   torch.compile(model) (default mode), on the GPU under bf16 autocast
                                  lightning lightning.Trainer, precision "32-true" (CPU) or "bf16-mixed" (GPU)
                               ResNet-50 on a GPU: amp, amp_fp16, compile and lightning in channels-last
                               (model and images), as NVIDIA's DeepLearningExamples train it; eager fp32 not.
  W: checkpoint                C: plain | checkpoint (torch.utils.checkpoint.checkpoint_sequential,
                                  use_reentrant=False, the same segments as Nitro's)
  W: pipeline                  C: dataloader (DataLoader, the same workers and per-batch work as the
                                  Prefetcher, pin_memory on a GPU)

The weights and the data are the ones `peer_nitro export` wrote to D/W (raw float32/int64 files and
meta.json); the batches are taken in the same order. Timing and memory follow peer_nitro.cpp: the
warm-up steps untimed, the GPU synchronised before each clock read; the peak on a GPU is
torch.cuda.max_memory_allocated over the timed steps; on the CPU it is the most CPU tensor bytes
live at once during 3 more steps, counted by Nitro's tracker (libnitro_peer_tracking.so, loaded with
ctypes into this process's torch).
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (the Python twins of bench/models/*.hpp)

MEMORY_STEPS = 3


def load_raw(path, dtype, shape):
    numel = math.prod(shape)
    size = os.path.getsize(path)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if size != numel * itemsize:
        sys.exit(f"peer_torch: {path} holds {size} bytes, expected {numel * itemsize}: export it again")
    return torch.from_file(path, shared=False, size=numel, dtype=dtype).reshape(shape)


DTYPES = {"float32": torch.float32, "int64": torch.int64}


# ---- models: the same parameters, registered in the same order, as peer_nitro.cpp ----

def mlp(meta):
    layers = []
    for i in range(meta["layers"]):
        layers += [nn.Linear(meta["in"] if i == 0 else meta["width"], meta["width"]), nn.ReLU()]
    layers.append(nn.Linear(meta["width"], meta["classes"]))
    return nn.Sequential(*layers)


def demo_cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 8 * 8, 10))


class EncoderLayer(nn.Module):
    def __init__(self, width, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Encoder(nn.Module):
    def __init__(self, meta):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(meta["seq"], meta["width"]))
        self.embed = nn.Embedding(meta["vocab"], meta["width"])
        self.layers = nn.ModuleList(EncoderLayer(meta["width"], meta["heads"], meta["ffn"]) for _ in range(meta["layers"]))
        self.norm = nn.LayerNorm(meta["width"])
        self.head = nn.Linear(meta["width"], meta["classes"])

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def make_model(meta):
    w = meta["workload"]
    if w == "resnet50":
        model = models.resnet50(meta["classes"])
    elif w == "gpt2":
        model = models.GPT(block=meta["seq"], vocab=meta["vocab"], layers=meta["layers"], heads=meta["heads"],
                           width=meta["width"])
    else:
        model = mlp(meta) if w == "mlp" else demo_cnn() if w == "cnn" else Encoder(meta)
    named = list(model.named_parameters())
    expected = [(p["name"], p["shape"]) for p in meta["params"]]
    got = [(n, list(p.shape)) for n, p in named]
    if got != expected:
        sys.exit(f"peer_torch: the {w} model's parameters differ from peer_nitro's:\n  python {got}\n  nitro  {expected}")
    return model


def load_weights(model, path):
    params = list(model.parameters())
    flat = load_raw(path, torch.float32, [sum(p.numel() for p in params)])
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def optimizer_of(params, meta):
    """AdamW(fused=True), PyTorch's defaults but the workload's learning rate, beta2 and weight decay
    (GPT-2: nanoGPT's 0.95, and 0.1 on every parameter); SGD(fused=True) with momentum where the workload has one
    (ResNet-50: torchvision's recipe), as peer_nitro sets them."""
    if meta.get("momentum", 0) > 0:
        return torch.optim.SGD(params, lr=meta["lr"], momentum=meta["momentum"], weight_decay=meta["weight_decay"],
                               fused=True)
    return torch.optim.AdamW(params, lr=meta["lr"], betas=(0.9, meta.get("beta2", 0.999)),
                             weight_decay=meta.get("weight_decay", 0.01), fused=True)


def loss_of(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# ---- measuring ----

class Tracker:
    """Nitro's CPU tensor tracker in this process (see tracking_shim.cpp), or nothing."""

    def __init__(self, path):
        self.lib = None
        if path:
            self.lib = ctypes.CDLL(path)
            self.lib.nitro_peer_tracking_end.restype = ctypes.c_longlong

    def __enter__(self):
        if self.lib:
            self.lib.nitro_peer_tracking_begin()
        self.peak = -1
        return self

    def __exit__(self, *exc):
        if self.lib:
            self.peak = self.lib.nitro_peer_tracking_end()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(step, batches, device, warmup, steps, tracker):
    """step(x, y) -> loss; warm-up, timed and (CPU) memory steps over the batches in order."""
    total = warmup + steps + (0 if device.type == "cuda" else MEMORY_STEPS)
    losses = torch.empty(total, device=device)
    i = 0

    def one():
        nonlocal i
        x, y = batches[i % len(batches)]
        losses[i].copy_(step(x, y))
        i += 1

    for _ in range(warmup):
        one()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        one()
    sync(device)
    seconds = time.perf_counter() - start
    peak_mb = -1.0
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(device) / 1048576.0
    else:
        with tracker as t:
            for _ in range(MEMORY_STEPS):
                one()
        peak_mb = t.peak / 1048576.0 if t.peak >= 0 else -1.0
    losses = losses.double().cpu().tolist()
    return {"seconds": seconds, "steps": steps, "samples": steps * batches[0][0].shape[0],
            "peak_mb": peak_mb, "final_loss": losses[warmup + steps - 1], "losses": losses}


def plain_step(model, optimizer, device, amp_dtype=None, scaler=None):
    """One training step, as the PyTorch recipes write it."""
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        if amp_dtype is None:
            loss = loss_of(model(x), y)
        else:
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = loss_of(model(x), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.detach()
    return step


def run_training(args, meta, device, tracker):
    d = os.path.join(args.dir, args.workload)
    model = make_model(meta)
    load_weights(model, os.path.join(d, "params.bin"))
    x = load_raw(os.path.join(d, "x.bin"), DTYPES[meta["x"]["dtype"]], meta["x"]["shape"])
    y = load_raw(os.path.join(d, "y.bin"), DTYPES[meta["y"]["dtype"]], meta["y"]["shape"])
    model.to(device)
    b = meta["batch"]
    batches = [(x[i * b:(i + 1) * b].to(device), y[i * b:(i + 1) * b].to(device)) for i in range(meta["batches"])]
    warmup = args.warmup if args.warmup >= 0 else meta["warmup"]
    steps = args.steps if args.steps > 0 else meta["steps"]
    gpu = device.type == "cuda"
    if gpu:
        torch.backends.cudnn.benchmark = True
    if gpu and args.workload == "resnet50" and args.config != "eager":
        model = model.to(memory_format=torch.channels_last)
        batches = [(bx.contiguous(memory_format=torch.channels_last), by) for bx, by in batches]
    if args.config == "lightning":
        return run_lightning(args, meta, model, batches, device, warmup, steps)
    optimizer = optimizer_of(model.parameters(), meta)
    if args.config == "eager":
        return measure(plain_step(model, optimizer, device), batches, device, warmup, steps, tracker)
    if args.config in ("amp", "compile") and gpu:
        torch.backends.cuda.matmul.allow_tf32 = True  # what Nitro's Advanced sets (hw::Settings::fast)
        torch.backends.cudnn.allow_tf32 = True
    if args.config == "amp":
        if not gpu:
            sys.exit("peer_torch: amp is a GPU configuration (bf16 autocast)")
        return measure(plain_step(model, optimizer, device, torch.bfloat16), batches, device, warmup, steps, tracker)
    if args.config == "amp_fp16":
        if not gpu:
            sys.exit("peer_torch: amp_fp16 is a GPU configuration")
        scaler = torch.amp.GradScaler("cuda")
        return measure(plain_step(model, optimizer, device, torch.float16, scaler), batches, device, warmup, steps, tracker)
    if args.config == "compile":
        compiled = torch.compile(model)
        return measure(plain_step(compiled, optimizer, device, torch.bfloat16 if gpu else None), batches, device,
                       warmup, steps, tracker)
    sys.exit(f"peer_torch: unknown config {args.config} for {args.workload}")


def run_lightning(args, meta, model, batches, device, warmup, steps):
    try:
        import lightning as L
    except ImportError:
        sys.exit("peer_torch: lightning is not installed (bench/run_cpu.sh installs it into the benchmark environment)")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, _):
            x, y = batch
            return loss_of(self.model(x), y)

        def configure_optimizers(self):
            return optimizer_of(self.parameters(), meta)

    class Batches(torch.utils.data.Dataset):  # pre-made batches, in order (batch_size=None)
        def __len__(self):
            return warmup + steps

        def __getitem__(self, i):
            return batches[i % len(batches)]

    losses = []
    clock = {}

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].detach())
            if batch_idx + 1 == warmup:
                sync(device)
                clock["start"] = time.perf_counter()
            if batch_idx + 1 == warmup + steps:
                sync(device)
                clock["end"] = time.perf_counter()

    gpu = device.type == "cuda"
    trainer = L.Trainer(accelerator="gpu" if gpu else "cpu", devices=1, precision="bf16-mixed" if gpu else "32-true",
                        max_steps=warmup + steps, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock()],
                        num_sanity_val_steps=0)
    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False, num_workers=0)
    trainer.fit(Module(), loader)
    seconds = clock["end"] - clock["start"]
    losses = torch.stack(losses).double().cpu().tolist()
    return {"seconds": seconds, "steps": steps, "samples": steps * batches[0][0].shape[0], "peak_mb": -1.0,
            "final_loss": losses[warmup + steps - 1], "losses": losses}


# ---- checkpoint: the 32-layer MLP of bench_checkpoint ----

def run_checkpoint(args, meta, device, tracker):
    from torch.utils.checkpoint import checkpoint_sequential
    torch.manual_seed(0)
    w = meta["width"]
    layers = []
    for _ in range(meta["layers"]):  # bench_checkpoint's: 32 x (Linear(width, width), ReLU)
        layers += [nn.Linear(w, w), nn.ReLU()]
    net = nn.Sequential(*layers).to(device)
    torch.manual_seed(1)
    x = torch.randn(meta["batch"], w).to(device)
    segments = math.ceil(math.sqrt(len(net)))
    if args.config == "plain":
        def step():
            net(x).pow(2).mean().backward()
    elif args.config == "checkpoint":
        def step():
            checkpoint_sequential(net, segments, x, use_reentrant=False).pow(2).mean().backward()
    else:
        sys.exit(f"peer_torch: unknown config {args.config} for checkpoint (plain, checkpoint)")

    def zero():
        for p in net.parameters():
            p.grad.zero_()

    warmup = args.warmup if args.warmup >= 0 else meta["warmup"]
    steps = args.steps if args.steps > 0 else meta["steps"]
    for _ in range(max(warmup, 1)):
        step()
    zero()
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        peak_mb = (torch.cuda.max_memory_allocated(device) - before) / 1048576.0
    else:
        with tracker as t:
            step()
        peak_mb = t.peak / 1048576.0 if t.peak >= 0 else -1.0
    zero()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = time.perf_counter() - start
    print(f"peer_torch: checkpoint {args.config}: {segments} segments")
    return {"seconds": seconds, "steps": steps, "samples": steps * meta["batch"], "peak_mb": peak_mb, "final_loss": None, "losses": []}


# ---- pipeline: DataLoader, the same L ms of work per batch as peer_nitro's SlowBatches ----

class SlowBatches(torch.utils.data.Dataset):
    """dataset[list of indices] -> a batch: cpu_ms of work (a busy wait), waiting until cpu_ms + io_ms
    have passed, then the batch gathered (a copy)."""

    def __init__(self, x, y, samples, cpu_ms, io_ms):
        self.x, self.y, self.samples, self.cpu_s, self.io_s = x, y, samples, cpu_ms / 1e3, io_ms / 1e3

    def __len__(self):
        return self.samples

    def __getitem__(self, indices):
        start = time.perf_counter()
        while time.perf_counter() - start < self.cpu_s:
            pass
        left = start + self.cpu_s + self.io_s - time.perf_counter()
        if left > 0:
            time.sleep(left)
        index = torch.tensor(indices, dtype=torch.int64) % self.x.shape[0]
        return self.x.index_select(0, index), self.y.index_select(0, index)


def spin(seconds, start):
    while time.perf_counter() - start < seconds:
        pass


def run_pipeline(args, meta, device):
    if args.config != "dataloader":
        sys.exit(f"peer_torch: unknown config {args.config} for pipeline (dataloader)")
    b, pool, workers = meta["batch"], meta["pool"], meta["workers"]
    warmup = args.warmup if args.warmup >= 0 else meta["warmup"]
    steps = args.steps if args.steps > 0 else meta["steps"]
    torch.manual_seed(1)
    x = torch.randn(pool * b, 3, 32, 32)
    y = torch.randint(10, (pool * b,))
    samples = (warmup + steps) * b
    data = SlowBatches(x, y, samples, meta["cpu_ms"], meta["io_ms"])
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(samples)), b, drop_last=False)
    gpu = device.type == "cuda"
    loader = torch.utils.data.DataLoader(data, sampler=sampler, batch_size=None, num_workers=workers,
                                         prefetch_factor=2, pin_memory=gpu)
    acc = torch.zeros((), device=device)
    step_s = meta["step_ms"] / 1e3
    seen = 0
    start = None
    for bx, _ in loader:
        if seen == warmup:
            sync(device)
            start = time.perf_counter()
        step_start = time.perf_counter()
        acc += bx.to(device, non_blocking=True).sum()
        spin(step_s, step_start)
        seen += 1
    sync(device)
    seconds = time.perf_counter() - start
    if seen != warmup + steps:
        sys.exit(f"peer_torch: the DataLoader gave {seen} batches")
    return {"seconds": seconds, "steps": steps, "samples": steps * b, "peak_mb": -1.0, "final_loss": acc.item(), "losses": []}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=-1)
    p.add_argument("--warmup", type=int, default=-1)
    p.add_argument("--tracking", default="")
    args = p.parse_args()
    with open(os.path.join(args.dir, args.workload, "meta.json")) as f:
        meta = json.load(f)
    if meta["device"] != args.device:
        sys.exit(f"peer_torch: {args.dir}/{args.workload} was exported for {meta['device']}, not {args.device}")
    device = torch.device(args.device)
    tracker = Tracker(args.tracking)
    if args.workload == "checkpoint":
        out = run_checkpoint(args, meta, device, tracker)
    elif args.workload == "pipeline":
        out = run_pipeline(args, meta, device)
    else:
        out = run_training(args, meta, device, tracker)
    out.update({"side": "python", "workload": args.workload, "config": args.config, "device": args.device,
                "samples_per_s": out["samples"] / out["seconds"], "steps_per_s": out["steps"] / out["seconds"]})
    print("PEER " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
