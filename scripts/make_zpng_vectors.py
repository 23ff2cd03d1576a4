#!/usr/bin/env python3
"""Reference ZPNG ("LOSSLESS") vectors, from an implementation independent of protocol/frames.ts.

ZPNG as PROTOCOL.md section 5 defines it: an 8-byte little-endian header
  u16 magic 0xFBF8, u16 width, u16 height, u8 channels, u8 bytes_per_channel
then one zstd frame. Decompressed: every row is filtered by subtracting the previous pixel's value
per channel (mod 256, 0 before the first pixel of the row). For 3 channels the filtered r, g, b
are stored as three planes b, g - b, g - r (mod 256); for 4 channels alpha follows as a fourth
plane; other channel counts stay interleaved.

Writes test/vectors/frames/<name>.zpng and <name>.raw (the HWC uint8 pixels) plus manifest.json.
(The resize's vectors come from scripts/make_resize_vectors.py.)
Deterministic: fixed seeds, zstd level 1 with the content size written (python-zstandard's default).

Usage: python3 scripts/make_zpng_vectors.py [out_dir]   (needs numpy and zstandard)
"""
import json
import os
import struct
import sys

import numpy as np
import zstandard

MAGIC = 0xFBF8


def zpng_encode(img: np.ndarray, level: int = 1) -> bytes:
    """img: uint8 [H, W, C] (or [H, W] for one channel) -> ZPNG bytes."""
    if img.ndim == 2:
        img = img[:, :, None]
    assert img.dtype == np.uint8 and img.ndim == 3
    h, w, c = img.shape
    filtered = img.copy()
    # Row-wise horizontal delta; uint8 arithmetic wraps mod 256.
    filtered[:, 1:, :] = img[:, 1:, :] - img[:, :-1, :]
    if c in (3, 4):
        r, g, b = filtered[..., 0], filtered[..., 1], filtered[..., 2]
        planes = [b, g - b, g - r]
        if c == 4:
            planes.append(filtered[..., 3])
        payload = b"".join(np.ascontiguousarray(p).tobytes() for p in planes)
    else:
        payload = filtered.tobytes()
    header = struct.pack("<HHHBB", MAGIC, w, h, c, 1)
    return header + zstandard.ZstdCompressor(level=level).compress(payload)


def zpng_decode(data: bytes) -> np.ndarray:
    """ZPNG bytes -> uint8 [H, W, C]."""
    magic, w, h, c, bpc = struct.unpack("<HHHBB", data[:8])
    assert magic == MAGIC and bpc == 1
    payload = np.frombuffer(zstandard.ZstdDecompressor().decompress(data[8:]), dtype=np.uint8)
    assert payload.size == w * h * c
    if c in (3, 4):
        planes = payload.reshape(c, h, w)
        b = planes[0]
        g = planes[1] + b
        r = g - planes[2]
        chans = [r, g, b] + ([planes[3]] if c == 4 else [])
        filtered = np.stack(chans, axis=-1)
    else:
        filtered = payload.reshape(h, w, c)
    # Undo the delta: cumulative sum along each row, mod 256.
    return (np.cumsum(filtered.astype(np.uint32), axis=1) % 256).astype(np.uint8)


def make_image(h: int, w: int, c: int, seed: int) -> np.ndarray:
    """A smooth gradient with shapes and a little noise, so the filter and planes all matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    chans = []
    for k in range(c):
        base = (x * (3 + k) + y * (5 - k) + 40 * k) % 256
        blob = ((x - w / 3) ** 2 + (y - h / 2) ** 2 < (min(h, w) / 4) ** 2) * (60 + 50 * k)
        noise = rng.integers(0, 8, size=(h, w))
        chans.append((base + blob + noise) % 256)
    return np.stack(chans, axis=-1).astype(np.uint8)


CASES = [
    # name, height, width, channels, seed
    ("gray_37x23", 23, 37, 1, 1),
    ("rgb_64x48", 48, 64, 3, 2),
    ("rgb_1x9", 9, 1, 3, 3),
    ("rgba_40x30", 30, 40, 4, 4),
    ("gray_alpha_16x12", 12, 16, 2, 5),
]


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "test", "vectors", "frames")
    os.makedirs(out, exist_ok=True)
    manifest = []
    for name, h, w, c, seed in CASES:
        img = make_image(h, w, c, seed)
        blob = zpng_encode(img)
        assert np.array_equal(zpng_decode(blob), img)
        with open(os.path.join(out, name + ".zpng"), "wb") as f:
            f.write(blob)
        with open(os.path.join(out, name + ".raw"), "wb") as f:
            f.write(img.tobytes())
        manifest.append({"name": name, "height": h, "width": w, "channels": c, "zpng_bytes": len(blob)})
    manifest = {"zpng": manifest}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
