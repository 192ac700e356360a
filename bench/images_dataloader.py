"""The Python side of bench/bench_images.cpp: Pillow decoding and a PyTorch DataLoader over a folder of JPEGs.

bench_images runs this script once per round, alternating with the rounds of its own (Nitro) side, and
reads the last line it prints (`images_per_s=<value> ...`). Start-up, imports and warm-up are not timed.

  --mode decode   Image.open(f).convert("RGB") on one thread, the first --images files of --root in
                  sorted path order (torchvision ImageFolder's order); --warmup files are decoded first,
                  untimed; prints images_per_s over --epochs passes.
  --mode loader   torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root) with the PIL loader,
                  transforms.v2 RandomResizedCrop(224) + RandomHorizontalFlip + ToImage +
                  ToDtype(float32, scale=True) + Normalize(ImageNet mean, std)), batch_size --batch,
                  shuffle, num_workers --workers, persistent workers (each worker runs torch with one
                  thread, as DataLoader sets it); --warmup untimed epochs, then --epochs timed ones;
                  prints images_per_s (samples delivered / seconds, the median epoch).
"""
import argparse
import os
import statistics
import sys
import time


def timed_epochs(epoch, warmup, epochs):
    """epoch() -> (samples, seconds): `warmup` untimed epochs, then max(1, epochs) timed ones; returns
    the samples of an epoch, samples/s at the median epoch time, and that time."""
    for _ in range(warmup):
        epoch()
    times = []
    n = 0
    for _ in range(max(1, epochs)):
        n, t = epoch()
        times.append(t)
    median = statistics.median(times)
    return n, n / median, median


def files_under(root):
    out = []
    for cls in sorted(os.listdir(root)):
        d = os.path.join(root, cls)
        if not os.path.isdir(d):
            continue
        for dirpath, dirnames, filenames in sorted(os.walk(d, followlinks=True)):
            for f in sorted(filenames):
                if f.lower().endswith((".jpg", ".jpeg")):
                    out.append(os.path.join(dirpath, f))
    return out


def decode(args):
    from PIL import Image

    files = files_under(args.root)[: args.images] if args.images > 0 else files_under(args.root)
    if not files:
        sys.exit(f"images_dataloader: no JPEG under {args.root}")

    def load(f):
        with Image.open(f) as im:
            out = im.convert("RGB")  # convert() loads (decodes) the image first
        return out.size

    for f in files[: args.warmup]:
        load(f)
    times = []
    checksum = 0
    for _ in range(max(1, args.epochs)):
        start = time.perf_counter()
        for f in files:
            w, h = load(f)
            checksum += w * h
        times.append(time.perf_counter() - start)
    rate = len(files) / statistics.median(times)
    import PIL
    from PIL import features

    print(f"info: Pillow {PIL.__version__}, libjpeg-turbo {features.check_feature('libjpeg_turbo')}, "
          f"{len(files)} files, pixels {checksum}")
    print(f"images_per_s={rate:.3f} seconds={statistics.median(times):.4f}", flush=True)


def loader(args):
    import torch
    import torchvision
    from torchvision import datasets
    from torchvision.transforms import v2

    torch.manual_seed(args.seed)
    transform = v2.Compose([
        v2.RandomResizedCrop(224, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    data = datasets.ImageFolder(args.root, transform=transform)  # default_loader: PIL, convert("RGB")
    dl = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                     persistent_workers=args.workers > 0, drop_last=False)

    def epoch():
        n = 0
        start = time.perf_counter()
        for images, labels in dl:
            n += labels.shape[0]
        return n, time.perf_counter() - start

    n, rate, seconds = timed_epochs(epoch, args.warmup, args.epochs)
    print(f"info: torch {torch.__version__}, torchvision {torchvision.__version__}, {len(data)} samples, "
          f"{len(data.classes)} classes, workers {args.workers}, main-process torch threads {torch.get_num_threads()}")
    print(f"images_per_s={rate:.3f} seconds={seconds:.4f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="the ImageFolder root (root/<class>/<file>.jpg)")
    p.add_argument("--mode", choices=["decode", "loader", "check"], required=True)
    p.add_argument("--images", type=int, default=0, help="decode: the first N files (0: all)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1, help="timed passes")
    p.add_argument("--warmup", type=int, default=1, help="decode: files; loader: epochs (untimed)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.mode == "check":  # what bench_images asks before it plans the Python rounds
        import PIL  # noqa: F401
        try:
            import torch  # noqa: F401
            import torchvision  # noqa: F401
            print("has_pil=1 has_torchvision=1", flush=True)
        except Exception as e:  # torchvision missing or not matching torch
            print(f"info: torchvision unavailable: {e}")
            print("has_pil=1 has_torchvision=0", flush=True)
        return
    if args.mode == "decode":
        decode(args)
    else:
        loader(args)


if __name__ == "__main__":
    main()
