"""The Python side of bench/bench_jpeg_pipeline.cpp: the same training fed by PyTorch's DataLoader.

bench_jpeg_pipeline runs this script once, after its own measurement, with the packed file it wrote
(data/packed.hpp's format, read here with numpy: the index's offset and the record count in the
footer's last 64 bytes, then 56 bytes a record: offset, length, label, ...), and reads the last line
it prints (`pipeline_images_per_s=<value> premade_images_per_s=<value>`).

  pipeline  torch.utils.data.DataLoader over the packed file's records repeated (sample i is record
            i % records, as on the C++ side), batch_size --batch, shuffle, --workers worker processes
            (persistent, pinned memory), each sample decoded with PIL (Image.open(...).convert("RGB"))
            and made by torchvision transforms.v2: RandomResizedCrop(--size) (PIL's antialiased
            resize), RandomHorizontalFlip, ToImage, ToDtype(float32, scale=True), Normalize(ImageNet);
            copied to the device with non_blocking=True.
  premade   4 batches made once on the device, cycled.
Both train the same model (torchvision.models.resnet50, or the small CNN of the CPU variant) with
SGD (lr 0.1, momentum 0.9), bf16 autocast, channels-last on a GPU, cudnn.benchmark: --warmup steps of
each, then --rounds rounds of --steps steps each, alternating (the one going first rotating), the
device synchronised before each clock read; a pipeline block first takes 2 x workers + 1 batches
untimed (those the DataLoader made ahead during the other block). Medians of the per-step times.

  --mode check   prints has_torchvision=1 when torch, torchvision and PIL import.
"""
import argparse
import io
import statistics
import sys
import time


def records(path):
    import numpy as np

    mm = np.memmap(path, dtype=np.uint8, mode="r")
    tail = mm[len(mm) - 64:].view(np.uint64)
    if bytes(mm[len(mm) - 8:]) != b"NPAKEND1":
        sys.exit(f"jpeg_pipeline_torch: {path} is not a packed file (no NPAKEND1 at its end)")
    index_at, count = int(tail[0]), int(tail[1])
    entry = np.dtype([("offset", "<u8"), ("length", "<u8"), ("label", "<i8"), ("box_first", "<u8"),
                      ("box_count", "<u8"), ("name_offset", "<u8"), ("name_length", "<u8")])
    index = np.frombuffer(mm, dtype=entry, count=count, offset=index_at)
    return index["offset"].astype(np.int64), index["length"].astype(np.int64), index["label"].astype(np.int64)


class Packed:
    """The packed file's records repeated to `samples`; the mapping opened in each worker."""

    def __init__(self, path, samples, transform):
        self.path, self.samples, self.transform = path, samples, transform
        self.offset, self.length, self.label = records(path)
        self.mm = None

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        if self.mm is None:
            self.mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        j = i % len(self.offset)
        data = self.mm[self.offset[j]: self.offset[j] + self.length[j]].tobytes()
        with Image.open(io.BytesIO(data)) as im:
            image = im.convert("RGB")
        return self.transform(image), int(self.label[j])


def small_cnn(classes):
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["run", "check"], default="run")
    p.add_argument("--packed")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--model", choices=["resnet50", "small"], default="resnet50")
    args = p.parse_args()
    if args.mode == "check":
        try:
            import PIL  # noqa: F401
            import torch  # noqa: F401
            import torchvision  # noqa: F401
            print("has_torchvision=1", flush=True)
        except Exception as e:  # torchvision missing, or not matching torch
            print(f"info: torchvision unavailable: {e}")
            print("has_torchvision=0", flush=True)
        return
    if not args.packed:
        sys.exit("jpeg_pipeline_torch: --packed FILE is needed")

    import torch
    import torchvision
    from torchvision.transforms import v2

    gpu = args.device == "cuda"
    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    transform = v2.Compose([
        v2.RandomResizedCrop(args.size, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ahead = 2 * args.workers + 1  # the DataLoader's batches made ahead (prefetch_factor 2 a worker) and one more
    steps = args.warmup + args.rounds * (ahead + args.steps) + ahead + 2
    data = Packed(args.packed, steps * args.batch, transform)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         pin_memory=gpu, persistent_workers=args.workers > 0, drop_last=True)
    batches = iter(loader)

    if args.model == "resnet50":
        model = torchvision.models.resnet50(num_classes=args.classes)
    else:
        model = small_cnn(args.classes)
    fmt = torch.channels_last if gpu else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def from_pipeline(n):
        for _ in range(n):
            x, y = next(batches)
            step(x.to(device, non_blocking=True, memory_format=fmt), y.to(device, non_blocking=True))

    premade = [(torch.randn(args.batch, 3, args.size, args.size, device=device).contiguous(memory_format=fmt),
                torch.randint(args.classes, (args.batch,), device=device)) for _ in range(4)]
    k = [0]

    def from_premade(n):
        for _ in range(n):
            x, y = premade[k[0] % len(premade)]
            k[0] += 1
            step(x, y)

    def seconds(f, n):
        sync()
        start = time.perf_counter()
        f(n)
        sync()
        return time.perf_counter() - start

    seconds(from_premade, args.warmup)
    seconds(from_pipeline, args.warmup)
    t_pipe, t_pre = [], []
    for r in range(args.rounds):
        for order in range(2):
            if (r + order) % 2 == 0:
                from_pipeline(ahead)
                t_pipe.append(seconds(from_pipeline, args.steps) / args.steps)
            else:
                t_pre.append(seconds(from_premade, args.steps) / args.steps)
    pipe, pre = statistics.median(t_pipe), statistics.median(t_pre)
    print(f"info: torch {torch.__version__}, torchvision {torchvision.__version__}, {args.model}, {args.workers} "
          f"DataLoader workers, batch {args.batch}, {args.size}x{args.size}, {len(data.offset)} files; ms/step: "
          f"DataLoader {pipe * 1e3:.2f}, pre-made {pre * 1e3:.2f}")
    print(f"pipeline_images_per_s={args.batch / pipe:.3f} premade_images_per_s={args.batch / pre:.3f} "
          f"ratio={pre / pipe:.4f}", flush=True)


if __name__ == "__main__":
    main()
