#!/usr/bin/env python3
"""Trains protocol/observation.zdict, the zstd dictionary for policy-server observations.

Samples are OpenPI-style observations, msgpack with ndarrays as openpi_client.msgpack_numpy writes
them ({b"__ndarray__": True, b"data": bytes, b"dtype": str, b"shape": [..]}, bin keys), in the
key layouts PROTOCOL.md section 6 names:
  - {"observation/image", "observation/wrist_image", "observation/state", "prompt"} (DROID/LIBERO)
  - {"images": {cam: frame}, "state", "prompt"} (ALOHA-style), HWC or CHW uint8 frames
  - the same with "image_codec" and the frames as JPEG / PNG / ZPNG bytes.
Frames come from the g1_pick_bottle videos (decoded with ffmpeg, resized with padding to 224x224 as
openpi_client.image_tools does) when available, else synthetic. States are float32 [8..32].

zstd --train reads at most the first 128 KB of each sample, which for raw frames is the message's
structure plus the start of the first frame: the part a dictionary can help with.

Usage: python3 scripts/train_zdict.py [--video-dir DIR] [--ffmpeg PATH] [--out protocol/observation.zdict]
Needs numpy, msgpack, zstandard, Pillow and the zstd CLI; writes test/vectors/zstd/* too.
"""
import argparse
import glob
import io
import os
import subprocess
import tempfile

import msgpack
import numpy as np
import zstandard
from PIL import Image

from make_zpng_vectors import zpng_encode

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DICT_ID = 0x56454C41  # "VELA"; ids below 32768 and from 2^31 up are reserved by RFC 8878.
MAX_DICT_BYTES = 112640  # zstd's default dictionary size, 110 KiB
SIZE = 224

PROMPTS = [
    "pick up the bottle and place it in the box",
    "pick the bottle",
    "put the red cube in the bowl",
    "open the drawer",
    "fold the towel",
    "stack the blocks",
    "pick up the fork",
    "turn on the stove and put the moka pot on it",
    "do something",
    "",
]
CAMS = [["cam_high", "cam_left_wrist", "cam_right_wrist"], ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"],
        ["cam_high"], ["observation.images.cam_high", "observation.images.cam_wrist"]]
CODECS = ["JPEG", "CODEC_JPEG_Q90", "CODEC_JPEG_Q75", "PNG", "LOSSLESS"]


def pack_array(obj):
    """openpi_client.msgpack_numpy.pack_array."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def packb(obj) -> bytes:
    return msgpack.packb(obj, default=pack_array)


def resize_with_pad(img: np.ndarray, size: int) -> np.ndarray:
    """openpi_client.image_tools.resize_with_pad (PIL bilinear, centred black padding)."""
    h, w = img.shape[:2]
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    resized = Image.fromarray(img).resize((rw, rh), resample=Image.BILINEAR)
    out = Image.new("RGB", (size, size), 0)
    out.paste(resized, ((size - rw) // 2, (size - rh) // 2))
    return np.asarray(out)


def video_frames(video_dir: str, ffmpeg: str, per_episode: int, episodes: int):
    frames = []
    for path in sorted(glob.glob(os.path.join(video_dir, "**", "*.mp4"), recursive=True))[:episodes]:
        raw = subprocess.run(
            [ffmpeg, "-v", "error", "-i", path, "-vf", "select=not(mod(n\\,37))", "-vsync", "vfr",
             "-frames:v", str(per_episode), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
            check=True, capture_output=True).stdout
        # The dataset's videos are 640x480.
        arr = np.frombuffer(raw, np.uint8).reshape(-1, 480, 640, 3)
        frames += [resize_with_pad(f, SIZE) for f in arr]
    return frames


def synthetic_frames(rng, n: int):
    frames = []
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    for i in range(n):
        base = np.stack([(x * rng.uniform(0.2, 1.5) + y * rng.uniform(0.2, 1.5) + rng.integers(0, 255)) for _ in range(3)], -1)
        for _ in range(rng.integers(2, 6)):
            cy, cx, r = rng.integers(0, SIZE, 3)
            base[(x - cx) ** 2 + (y - cy) ** 2 < (r // 3) ** 2] = rng.integers(0, 255, 3)
        base += rng.normal(0, rng.uniform(0, 6), base.shape)
        if i % 4 == 0:  # letterboxed, as resize_with_pad leaves 4:3 frames
            base[:28] = 0
            base[-28:] = 0
        frames.append(np.clip(base, 0, 255).astype(np.uint8))
    return frames


def encode(frame: np.ndarray, codec: str) -> bytes:
    if codec == "LOSSLESS":
        return zpng_encode(frame)
    buf = io.BytesIO()
    if codec == "PNG":
        Image.fromarray(frame).save(buf, format="PNG")
    else:
        q = int(codec.rsplit("Q", 1)[1]) if codec.startswith("CODEC_JPEG_Q") else 75
        Image.fromarray(frame).save(buf, format="JPEG", quality=q)
    return buf.getvalue()


def observation(rng, frames, kind: int) -> bytes:
    pick = lambda: frames[rng.integers(len(frames))]
    state = rng.normal(0, 1, int(rng.integers(8, 33))).astype(np.float32)
    prompt = PROMPTS[rng.integers(len(PROMPTS))]
    if kind == 0:
        return packb({"observation/image": pick(), "observation/wrist_image": pick(),
                      "observation/state": state, "prompt": prompt})
    if kind == 1:
        cams = CAMS[rng.integers(len(CAMS))]
        chw = rng.random() < 0.3
        images = {c: (pick().transpose(2, 0, 1).copy() if chw else pick()) for c in cams}
        return packb({"images": images, "state": state, "prompt": prompt})
    codec = CODECS[rng.integers(len(CODECS))]
    if kind == 2:
        return packb({"observation/image": encode(pick(), codec), "observation/wrist_image": encode(pick(), codec),
                      "observation/state": state, "prompt": prompt, "image_codec": codec})
    cams = CAMS[rng.integers(len(CAMS))]
    return packb({"images": {c: encode(pick(), codec) for c in cams}, "state": state, "prompt": prompt,
                  "image_codec": codec})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--video-dir", default="/work/shared/datasets/g1_pick_bottle/videos")
    ap.add_argument("--ffmpeg", default=os.path.join(ROOT, "node_modules/@ffmpeg-installer/linux-x64/ffmpeg"))
    ap.add_argument("--out", default=os.path.join(ROOT, "protocol", "observation.zdict"))
    ap.add_argument("--samples", type=int, default=600)
    args = ap.parse_args()
    rng = np.random.default_rng(20261130)

    frames = synthetic_frames(rng, 24)
    if os.path.isdir(args.video_dir) and os.path.exists(args.ffmpeg):
        frames += video_frames(args.video_dir, args.ffmpeg, per_episode=4, episodes=12)
    print(f"{len(frames)} frames")

    train = [observation(rng, frames, i % 4) for i in range(args.samples)]
    held = [observation(rng, frames, i % 4) for i in range(40)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, s in enumerate(train):
            p = os.path.join(tmp, f"{i:05d}.msgpack")
            with open(p, "wb") as f:
                f.write(s)
            paths.append(p)
        subprocess.run(["zstd", "--train", "-q", "-f", f"--maxdict={MAX_DICT_BYTES}", f"--dictID={DICT_ID}",
                        "-o", args.out, *paths], check=True)
    with open(args.out, "rb") as f:
        dict_bytes = f.read()
    zd = zstandard.ZstdCompressionDict(dict_bytes)
    print(f"dictionary {len(dict_bytes)} bytes, id {zd.dict_id()}")

    plain = zstandard.ZstdCompressor(level=1)
    with_dict = zstandard.ZstdCompressor(level=1, dict_data=zd)
    for kind, name in enumerate(["raw openpi keys", "raw images map", "coded openpi keys", "coded images map"]):
        group = held[kind::4]
        total = sum(len(s) for s in group)
        a = sum(len(plain.compress(s)) for s in group)
        b = sum(len(with_dict.compress(s)) for s in group)
        print(f"{name:18s} {total / len(group) / 1024:8.1f} KiB/msg  level1 {a / total:.4f}  +dict {b / total:.4f}")
    small = packb({"observation/state": np.arange(14, dtype=np.float32), "prompt": "pick up the bottle"})
    print(f"state-only message {len(small)} B: level1 {len(plain.compress(small))} B, +dict {len(with_dict.compress(small))} B")

    # Vectors for test/zstd.test.ts, made by python-zstandard (an encoder other than ours and the CLI).
    vec = os.path.join(ROOT, "test", "vectors", "zstd")
    os.makedirs(vec, exist_ok=True)
    obs = packb({"observation/image": np.full((8, 8, 3), 7, np.uint8), "observation/state": np.linspace(-1, 1, 8, dtype=np.float32),
                 "prompt": "pick up the bottle", "image_codec": "RAW"})
    files = {
        "obs.msgpack": obs,
        "obs.dict.zst": with_dict.compress(obs),
        "obs.nodict.zst": plain.compress(obs),
        # A streaming compressor that is not told the size writes no Frame_Content_Size.
        "obs.nosize.zst": zstandard.ZstdCompressor(level=1, write_content_size=False).compress(obs),
    }
    for name, data in files.items():
        with open(os.path.join(vec, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
