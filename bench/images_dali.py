"""The DALI side of bench/bench_images.cpp (--parts dali): NVIDIA DALI's CPU pipeline over a folder of JPEGs.

bench_images runs this script once per round, alternating with the rounds of its own (Nitro) side, and
reads the last line it prints (`images_per_s=<value> ...`). Start-up, imports, the pipeline's build and
the warm-up epochs are not timed. The same argument conventions as bench/images_dataloader.py.

  --mode loader   a DALI pipeline on the CPU only (device_id=None; every operator device="cpu"):
                  fn.readers.file(file_root=--root, random_shuffle) -> fn.decoders.image_random_crop
                  (RGB; torchvision RandomResizedCrop's defaults: random_area [0.08, 1],
                  random_aspect_ratio [3/4, 4/3], 10 attempts; it decodes only the crop's region) ->
                  fn.resize to 224x224 (linear, antialiased: DALI's defaults) -> fn.crop_mirror_normalize
                  (mirror from fn.random.coin_flip(0.5), ImageNet mean and std times 255, float32, CHW),
                  batch_size --batch, num_threads --workers; --warmup untimed epochs, then --epochs timed
                  ones; prints images_per_s (samples delivered / seconds, the median epoch). An epoch is
                  ceil(files / batch) pipeline runs; the batches stay DALI's TensorListCPU (no copy into
                  torch tensors: DALI's own throughput, its best case).
  --mode check    prints has_dali=1 (and DALI's version) when nvidia.dali imports, else has_dali=0.
  --mode install  the same, installing DALI first where it does not import: `pip install
                  nvidia-dali-cuda130` into this Python (the benchmark environment cmake/deps.sh found
                  or made; CPU-only use needs no GPU), torch pinned to the version already there, as
                  bench/run_cpu.sh installs Lightning. NITRO_BENCH_NO_INSTALL=1 skips the install.
                  CI never runs it; cmake/deps.sh does not install DALI.
"""
import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from images_dataloader import timed_epochs  # noqa: E402  (the same epoch timing as the DataLoader side)


def check():
    try:
        import nvidia.dali as dali

        print(f"info: DALI {dali.__version__}")
        print("has_dali=1", flush=True)
    except Exception as e:  # not installed, or not loadable on this machine
        print(f"info: nvidia.dali unavailable: {e}")
        print("has_dali=0", flush=True)


def install():
    import importlib.util
    import os
    import subprocess

    if importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None:
        return check()
    if os.environ.get("NITRO_BENCH_NO_INSTALL") == "1":
        print("images_dali: nvidia.dali is not installed and NITRO_BENCH_NO_INSTALL=1: not installing it")
        return check()
    pins = []
    try:
        import torch

        pins = [f"torch=={torch.__version__.split('+')[0]}"]
    except Exception:  # no torch here: nothing to pin
        pass
    print(f"images_dali: installing nvidia-dali-cuda130 into {sys.prefix} ({', '.join(pins) or 'no torch to pin'})",
          flush=True)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        "nvidia-dali-cuda130", *pins], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(f"images_dali: pip install nvidia-dali-cuda130 failed (exit {r.returncode}):")
        for line in r.stdout.splitlines()[-10:]:
            print(f"  {line}")
    # A fresh interpreter: this one may have cached the failed look-up of nvidia.dali.
    r = subprocess.run([sys.executable, __file__, "--root", ".", "--mode", "check"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="", flush=True)


def loader(args):
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255]

    @pipeline_def(batch_size=args.batch, num_threads=args.workers, device_id=None, seed=args.seed + 1)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=args.root, random_shuffle=True, name="files")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10)
        images = fn.resize(images, device="cpu", resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, device="cpu", dtype=types.FLOAT, output_layout="CHW",
                                          mean=mean, std=std, mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    pipe = pipeline()
    pipe.build()
    files = pipe.epoch_size("files")
    if files == 0:
        sys.exit(f"images_dali: no image under {args.root}")
    runs = math.ceil(files / args.batch)

    def epoch():
        n = 0
        start = time.perf_counter()
        for _ in range(runs):
            images, labels = pipe.run()
            n += len(labels)
        return n, time.perf_counter() - start

    # The first batch's shape and type, checked once (untimed), as bench_images checks Nitro's.
    images, labels = pipe.run()
    first = images.as_tensor()
    if tuple(first.shape()) != (args.batch, 3, 224, 224) or first.dtype != types.FLOAT:
        sys.exit(f"images_dali: a batch is {first.shape()} {first.dtype}, not float [{args.batch}, 3, 224, 224]")
    n, rate, seconds = timed_epochs(epoch, args.warmup, args.epochs)
    print(f"info: DALI {dali.__version__}, CPU only (device_id=None), {files} files, batch {args.batch}, "
          f"num_threads {args.workers}, {runs} runs an epoch")
    print(f"images_per_s={rate:.3f} seconds={seconds:.4f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="the ImageFolder root (root/<class>/<file>.jpg)")
    p.add_argument("--mode", choices=["loader", "check", "install"], required=True)
    p.add_argument("--workers", type=int, default=2, help="DALI's num_threads")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1, help="timed epochs")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.mode == "check":
        check()
    elif args.mode == "install":  # what bench_images asks before it plans the DALI rounds
        install()
    else:
        loader(args)


if __name__ == "__main__":
    main()
