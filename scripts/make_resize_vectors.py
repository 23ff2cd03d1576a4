#!/usr/bin/env python3
"""Reference vectors for protocol/resize.ts (MODEL.md D12): LeRobot's image pre-processing for
pi0 / pi0.5, computed by PyTorch.

LeRobot's PI0Policy / PI05Policy turn a frame into float32 in [0, 1] and call
`resize_with_pad_torch` (lerobot/policies/common/vla_utils.py): ratio = max(W / w, H / h), the
picture resized to int(H / ratio) x int(W / ratio) by
`F.interpolate(mode="bilinear", align_corners=False)` (no antialias), then centred zero padding.
This script does those steps with PyTorch's own F.interpolate on frames of several sizes and
writes, per case, in test/vectors/resize/:
  <name>.in.raw    uint8 [H, W, 3], the frame
  <name>.out.f32   float32 [rh, rw, 3], the resized picture before padding, in [0, 1], as LeRobot
                   hands it to the model (times 2, minus 1)
and manifest.json ({name, height, width, size, rh, rw, top, left} per case). Deterministic (fixed seeds).

Usage: python3 scripts/make_resize_vectors.py [out_dir]   (needs numpy and torch)
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# (height, width, size): landscape and portrait downscales (5x included), a mild one, an upscale, odd sizes.
CASES = [(120, 160, 96), (160, 120, 32), (120, 160, 112), (24, 16, 32), (7, 11, 5), (50, 37, 20)]


def make_frame(h: int, w: int, seed: int) -> np.ndarray:
    """A frame with smooth gradients, hard edges and noise, so every tap and weight matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 127 + 120 * np.sin(x / 3 + y / 5)], axis=-1)
    base[(x // 7 + y // 5) % 2 == 0] = 255 - base[(x // 7 + y // 5) % 2 == 0]
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def lerobot_resize(frame: np.ndarray, size: int):
    """LeRobot's steps for one uint8 [H, W, 3] frame: float32 [0, 1], resize, the geometry."""
    h, w = frame.shape[:2]
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    x = torch.from_numpy(frame).to(torch.float32).div(255.0).permute(2, 0, 1)[None]
    y = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False)
    pad_h0, pad_w0 = (size - rh) // 2, (size - rw) // 2
    return y[0].permute(1, 2, 0).contiguous().numpy(), rh, rw, pad_h0, pad_w0


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "test", "vectors", "resize")
    os.makedirs(out, exist_ok=True)
    manifest = []
    for i, (h, w, size) in enumerate(CASES):
        frame = make_frame(h, w, 100 + i)
        values, rh, rw, top, left = lerobot_resize(frame, size)
        name = f"{h}x{w}_to_{size}"
        with open(os.path.join(out, name + ".in.raw"), "wb") as f:
            f.write(frame.tobytes())
        with open(os.path.join(out, name + ".out.f32"), "wb") as f:
            f.write(values.astype("<f4").tobytes())
        manifest.append({"name": name, "height": h, "width": w, "size": size, "rh": rh, "rw": rw, "top": top, "left": left})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cases": manifest}, f, indent=1)
        f.write("\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
