"""The image files that tests/image/decode.cpp decodes, and Pillow's pixels for them.

    python make_images.py OUT_DIR

writes OUT_DIR/<name>.jpg or .png, OUT_DIR/<ref>.rgb (the reference: height x width x 3 bytes, RGB) and
OUT_DIR/manifest.txt, one line a reference: "<file> <ref> <height> <width> <scale>". The reference is
Pillow's `Image.open(f).convert("RGB")`, after `draft("RGB", ...)` where scale > 1 (libjpeg's reduced-size
decoding), except for 16-bit grey PNG: numpy's `value >> 8` (Pillow's convert clips "I;16" at 255).
Also damaged files for the error tests (no reference): bad_crc_ihdr.png, bad_block_idat.png,
short_idat.png, huge.png (an IHDR of 100000 x 100000).

Needs numpy and Pillow. The real photographs come from scikit-image's data folder when that is
installed (found without importing skimage, whose own dependencies may be missing).
"""
import importlib.util
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

out = sys.argv[1]
manifest = []


def picture(h, w, seed):
    """Smooth shading, sharp edges and noise: something for every part of a JPEG codec to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 17.0) * np.cos(y / 11.0)
    g = 255 * x / max(w - 1, 1)
    b = 255.0 * ((x // 8 + y // 8) % 2)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def reference(file, ref, im):
    rgb = im.convert("RGB")
    with open(os.path.join(out, ref + ".rgb"), "wb") as f:
        f.write(rgb.tobytes())
    return rgb.size


def full(file, ref=None):
    ref = ref or file.replace(".", "_")
    with Image.open(os.path.join(out, file)) as im:
        w, h = reference(file, ref, im)
    manifest.append(f"{file} {ref} {h} {w} 1")


def draft(file, s):
    with Image.open(os.path.join(out, file)) as im:
        W, H = im.size
        im.draft("RGB", (W // s, H // s))
        assert im.size == ((W + s - 1) // s, (H + s - 1) // s), (file, s, im.size)
        ref = os.path.splitext(file)[0] + f".d{s}"
        w, h = reference(file, ref, im)
    manifest.append(f"{file} {ref} {h} {w} {s}")


def save(im, file, **kw):
    im.save(os.path.join(out, file), **kw)
    return file


# ---- JPEG, written by Pillow (its libjpeg-turbo).
rgb = Image.fromarray(picture(217, 333, 1))
jpegs = {
    "j420.jpg": dict(quality=85, subsampling=2),
    "j444.jpg": dict(quality=92, subsampling=0),
    "j422.jpg": dict(quality=80, subsampling=1),
    "jprog.jpg": dict(quality=80, subsampling=2, progressive=True),
    "jrst.jpg": dict(quality=85, subsampling=2, restart_marker_rows=1),
    "jq100.jpg": dict(quality=100, subsampling=0),
}
for file, kw in jpegs.items():
    full(save(rgb, file, **kw))
with open(os.path.join(out, "jrst.jpg"), "rb") as f:
    assert b"\xff\xdd" in f.read()  # DRI: restart markers are there
full(save(rgb.convert("L"), "jgrey.jpg", quality=85))
cmyk = np.concatenate([picture(217, 333, 2), picture(217, 333, 3)[:, :, :1] // 2], axis=2)
full(save(Image.frombytes("CMYK", (333, 217), cmyk.tobytes()), "jcmyk.jpg", quality=90))
full(save(Image.fromarray(picture(1, 1, 4)), "j1x1.jpg", quality=90))
full(save(Image.fromarray(picture(9, 17, 5)), "j17x9.jpg", quality=90, subsampling=2))
full(save(Image.fromarray(picture(7, 31, 6)), "j31x7_422.jpg", quality=90, subsampling=1))
full(save(Image.fromarray(picture(9, 17, 7)).convert("L"), "j17x9_grey.jpg", quality=90))
for file in ("j420.jpg", "j444.jpg", "j422.jpg", "jprog.jpg", "jrst.jpg", "jgrey.jpg", "jcmyk.jpg"):
    for s in (2, 4, 8):
        draft(file, s)
for s in (2, 4, 8):
    draft("j17x9.jpg", s)

# ---- PNG written by Pillow.
small = Image.fromarray(picture(23, 37, 8))
full(save(small, "prgb.png"))
full(save(small.convert("L"), "pgrey.png"))
la = Image.merge("LA", (small.convert("L"), Image.fromarray(picture(23, 37, 9)[:, :, 0])))
full(save(la, "pla.png"))
full(save(small.quantize(64), "ppal.png"))
full(save(small.quantize(64), "ppal_trns.png", transparency=5))
full(save(small.quantize(16), "ppal4.png", bits=4))
full(save(small, "prgb_trns.png", transparency=(10, 20, 30)))
full(save(small.convert("L"), "pgrey_trns.png", transparency=7))
rgba = small.copy()
rgba.putalpha(Image.fromarray(picture(23, 37, 10)[:, :, 1]))
full(save(rgba, "prgba.png"))
full(save(small.convert("1"), "pbit1.png"))


# ---- PNG written here: what Pillow does not write (16-bit colour, 2- and 4-bit grey, Adam7).
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def packed_rows(a, depth):
    """a: H x W x C samples; rows of bytes, each with filter type 0 in front."""
    h = a.shape[0]
    if depth == 16:
        flat = a.astype(">u2").reshape(h, -1).view(np.uint8)
    elif depth == 8:
        flat = a.astype(np.uint8).reshape(h, -1)
    else:
        s = a.reshape(h, -1).astype(np.uint8)
        bits = (s[:, :, None] >> np.arange(depth - 1, -1, -1, dtype=np.uint8)) & 1
        flat = np.packbits(bits.reshape(h, -1), axis=1)
    return b"".join(b"\x00" + row.tobytes() for row in flat)


ADAM7 = [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)]


def png(a, color_type, depth, interlace=False, extra=b""):
    h, w = a.shape[:2]
    if interlace:
        raw = b"".join(packed_rows(a[y0::dy, x0::dx], depth) for y0, x0, dy, dx in ADAM7
                       if a[y0::dy, x0::dx].size > 0)
    else:
        raw = packed_rows(a, depth)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(raw, 9)) +
            chunk(b"IEND", b""))


def write(file, data):
    with open(os.path.join(out, file), "wb") as f:
        f.write(data)
    return file


rng = np.random.default_rng(11)
rgb16 = (picture(23, 37, 12).astype(np.uint16) * 257) ^ rng.integers(0, 256, (23, 37, 3), dtype=np.uint16)
full(write("p16rgb.png", png(rgb16, 2, 16)))
for depth in (1, 2, 4):
    full(write(f"pgrey{depth}.png", png(rng.integers(0, 1 << depth, (13, 19, 1)), 0, depth)))
full(write("pgrey2_trns.png", png(rng.integers(0, 4, (13, 19, 1)), 0, 2, extra=chunk(b"tRNS", b"\x00\x02"))))
full(write("padam7.png", png(picture(21, 33, 13), 2, 8, interlace=True)))
full(write("padam7_grey2.png", png(rng.integers(0, 4, (21, 33, 1)), 0, 2, interlace=True)))
full(write("padam7_rgba16.png", png(rng.integers(0, 65536, (11, 13, 4)), 6, 16, interlace=True)))
grey16 = rng.integers(0, 65536, (23, 37), dtype=np.uint16)
write("p16grey.png", png(grey16[:, :, None], 0, 16))
with Image.open(os.path.join(out, "p16grey.png")) as im:
    assert im.mode in ("I;16", "I;16B", "I") and np.array_equal(np.asarray(im).astype(np.uint16), grey16)
write("p16grey_png.rgb", np.repeat((grey16 >> 8).astype(np.uint8)[:, :, None], 3, axis=2).tobytes())
manifest.append("p16grey.png p16grey_png 23 37 1")

# ---- Damaged PNGs (a CRC has to be right for the damage past it to be what libpng reports).
good = png(picture(23, 37, 14), 2, 8)
bad = bytearray(good)
bad[8 + 8 + 4] ^= 0x01  # IHDR's width, CRC left as it was
write("bad_crc_ihdr.png", bytes(bad))
raw = packed_rows(picture(23, 37, 14), 8)
z = bytearray(zlib.compress(raw, 9))
z[2] |= 0x06  # the first deflate block's type: 3, which is reserved
ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 37, 23, 8, 2, 0, 0, 0))
write("bad_block_idat.png", b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", bytes(z)) + chunk(b"IEND", b""))
write("short_idat.png", b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", zlib.compress(raw[: len(raw) // 2])) +
      chunk(b"IEND", b""))
write("huge.png", b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)) +
      chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + chunk(b"IEND", b""))

# ---- Real photographs (scikit-image's data), as PNG and re-encoded as JPEG; its own JPEGs.
spec = importlib.util.find_spec("skimage")
data = os.path.join(list(spec.submodule_search_locations)[0], "data") if spec else ""
if os.path.isdir(data):
    photos = 0
    for name, kw in (("astronaut", dict(quality=90)), ("chelsea", dict(quality=75)),
                     ("coffee", dict(quality=90, progressive=True)), ("camera", dict(quality=85))):
        with Image.open(os.path.join(data, name + ".png")) as im:
            im.load()
            save(im, f"photo_{name}.png")
            save(im, f"photo_{name}.jpg", **kw)
        full(f"photo_{name}.png")
        full(f"photo_{name}.jpg")
        for s in (2, 4, 8):
            draft(f"photo_{name}.jpg", s)
        photos += 1
    for name in ("rocket", "retina"):
        with open(os.path.join(data, name + ".jpg"), "rb") as f:
            write(f"photo_{name}.jpg", f.read())
        full(f"photo_{name}.jpg")
        draft(f"photo_{name}.jpg", 4)

with open(os.path.join(out, "manifest.txt"), "w") as f:
    f.write("\n".join(manifest) + "\n")
