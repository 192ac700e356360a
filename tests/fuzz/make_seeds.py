"""The seed files of the image_decode and yolo_labels fuzz targets (tests/fuzz/corpus/<target>/).

    python tests/fuzz/make_seeds.py tests/fuzz/corpus

Images: small JPEGs (baseline 4:2:0, 4:2:2, 4:4:4, progressive, restart markers, grey, Adobe CMYK,
1 x 1, odd sizes) written by Pillow, and PNGs (RGB, grey, grey+alpha, palette with tRNS, RGBA, 1-bit,
2-bit, 16-bit colour, Adam7 interlaced) written by Pillow or here (what Pillow does not write), as
tests/image/make_images.py makes them but a few KB each. Each has 4 bytes appended that the
target reads as its options (image_decode.cpp: the decoders ignore bytes after the image).
YOLO labels: valid lines, blank lines, CRLF, tabs, and bad numbers. Needs numpy and Pillow (the
Python of build/deps.cmake's NITRO_PYTHON has both). packed_reader and record_reader make their own
seeds (--make-corpus).
"""
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

out = sys.argv[1]


def picture(h, w, seed):
    """Smooth shading, sharp edges and noise, as tests/image/make_images.py's."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 7.0) * np.cos(y / 5.0)
    g = 255 * x / max(w - 1, 1)
    b = 255.0 * ((x // 8 + y // 8) % 2)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write(target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)


images = []  # (name, bytes)


def pil(im, name, **kw):
    b = io.BytesIO()
    im.save(b, format="JPEG" if name.endswith(".jpg") else "PNG", **kw)
    images.append((name, b.getvalue()))


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def packed_rows(a, depth):
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
        raw = b"".join(packed_rows(a[y0::dy, x0::dx], depth) for y0, x0, dy, dx in ADAM7 if a[y0::dy, x0::dx].size > 0)
    else:
        raw = packed_rows(a, depth)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


# ---- JPEG (Pillow's libjpeg-turbo), 40 x 48: big enough for every reduction (1/2, 1/4, 1/8).
rgb = Image.fromarray(picture(40, 48, 1))
pil(rgb, "j420.jpg", quality=85, subsampling=2)
pil(rgb, "j422.jpg", quality=80, subsampling=1)
pil(rgb, "j444.jpg", quality=92, subsampling=0)
pil(rgb, "jprog.jpg", quality=80, subsampling=2, progressive=True)
pil(rgb, "jrst.jpg", quality=85, subsampling=2, restart_marker_rows=1)
assert b"\xff\xdd" in images[-1][1]  # DRI: restart markers are there
pil(rgb.convert("L"), "jgrey.jpg", quality=85)
pil(rgb.convert("L"), "jgrey_prog.jpg", quality=75, progressive=True)
cmyk = np.concatenate([picture(24, 32, 2), picture(24, 32, 3)[:, :, :1] // 2], axis=2)
pil(Image.frombytes("CMYK", (32, 24), cmyk.tobytes()), "jcmyk.jpg", quality=90)  # Adobe APP14, inverted
pil(Image.fromarray(picture(1, 1, 4)), "j1x1.jpg", quality=90)
pil(Image.fromarray(picture(9, 17, 5)), "j17x9.jpg", quality=90, subsampling=2)

# ---- PNG, 12 x 16 (Pillow's) and written here (16-bit, 2-bit grey, Adam7).
small = Image.fromarray(picture(12, 16, 8))
pil(small, "prgb.png")
pil(small.convert("L"), "pgrey.png")
pil(Image.merge("LA", (small.convert("L"), Image.fromarray(picture(12, 16, 9)[:, :, 0]))), "pla.png")
pil(small.quantize(16), "ppal_trns.png", transparency=5)
rgba = small.copy()
rgba.putalpha(Image.fromarray(picture(12, 16, 10)[:, :, 1]))
pil(rgba, "prgba.png")
pil(small.convert("1"), "pbit1.png")
rng = np.random.default_rng(11)
images.append(("p16rgb.png", png(picture(7, 9, 12).astype(np.uint16) * 257, 2, 16)))
images.append(("pgrey2_trns.png", png(rng.integers(0, 4, (7, 11, 1)), 0, 2, extra=chunk(b"tRNS", b"\x00\x02"))))
images.append(("padam7.png", png(picture(11, 13, 13), 2, 8, interlace=True)))
images.append(("padam7_rgba16.png", png(rng.integers(0, 65536, (5, 7, 4)), 6, 16, interlace=True)))

# 4 option bytes each (image_decode.cpp): both layouts, fast, decode_into, a reduced crop, a crop past
# the image, a low max_pixels; draft minimums from 1 to 16.
for i, (name, data) in enumerate(images):
    t0 = [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 16, 32, 6, 7, 10, 11, 14, 15, 1, 4][i % 20]
    t1 = (i * 37 + 3) % 256
    write("image_decode", name, data + bytes([t0, t1, (i * 53 + 1) % 256, (i * 29 + 7) % 256]))

# ---- YOLO label files.
labels = {
    "two_boxes.txt": b"0 0.5 0.5 0.25 0.25\n3 0.1 0.2 0.05 0.1\n",
    "no_newline.txt": b"12 0.25 0.75 0.5 0.125",
    "blank_lines.txt": b"\n0 0.5 0.5 1 1\n\n   \n\t\n1 0 0 0 0\n\n",
    "crlf_tabs.txt": b"2\t0.3\t0.4\t0.1\t0.2\r\n 7  0.9 0.9  0.05 0.05 \r\n",
    "exponents.txt": b"1e0 5e-1 0.5E0 2.5e-01 1.0\n0 1 1 1 1\n",
    "empty.txt": b"",
    "bad_letters.txt": b"0 0.5 abc 0.2 0.2\n",
    "bad_four.txt": b"0 0.5 0.5 0.2\n",
    "bad_six_polygon.txt": b"0 0.1 0.1 0.2 0.1 0.2\n",
    "bad_class.txt": b"1.5 0.5 0.5 0.2 0.2\n-1 0.5 0.5 0.2 0.2\n",
    "bad_range.txt": b"0 1.5 0.5 0.2 0.2\n",
    "bad_nan_inf.txt": b"0 nan 0.5 0.2 0.2\n0 inf 0.5 0.2 0.2\n",
    "bad_comma.txt": b"0,0.5,0.5,0.2,0.2\n",
    "bad_big_class.txt": b"1000000000 0.5 0.5 0.2 0.2\n",
    "bad_comment.txt": b"# class cx cy w h\n0 0.5 0.5 0.2 0.2\n",
}
for name, data in labels.items():
    write("yolo_labels", name, data)
