"""Datums both test files train on: one 48x64 camera, a 7-dim state, a [4, 6] action chunk (the rest is the model's padding)."""

import numpy as np

H, A, S = 4, 6, 7


def datum(seed, actions=True):
    """A seeded datum: uint8 [48, 64, 3] cam_high, float32 [S] state, float32 [H, A] actions unless ``actions`` is False."""
    rng = np.random.default_rng(seed)
    d = {"observation": {"image": {"cam_high": rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)}, "state": rng.standard_normal(S).astype(np.float32), "prompt": "pick up the bottle"}}
    if actions:
        d["actions"] = rng.standard_normal((H, A)).astype(np.float32)
    return d
