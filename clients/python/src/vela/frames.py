"""Camera frames as the session ops take them (docs/PROTOCOL.md section 3).

A frame is a numpy ``uint8`` array ``[H, W, 3]`` (RGB). With codec ``"RAW"`` it is sent as it
is (an ndarray); ``"PNG"``, ``"JPEG"`` and ``"CODEC_JPEG_Q<N>"`` encode it here with Pillow
(``pip install Pillow``, or the package's ``[images]`` extra), which cuts a 480x640 frame from 922 kB to tens of kB. The
server resizes any size with padding to the model's image size, as LeRobot and openpi do.
Bytes given as a frame are sent untouched (already encoded with the request's codec).
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np

CODECS = ("RAW", "PNG", "JPEG")


def encode_frame(frame: Any, codec: str) -> Any:
    """``frame`` (uint8 ``[H, W, 3]``, or bytes already encoded) as the wire value for ``codec``.

    @raises ValueError: a frame that is not uint8 ``[H, W, 3]``, or an unknown codec.
    @raises ImportError: PNG / JPEG without Pillow.
    """
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return bytes(frame)
    arr = np.asarray(frame)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"a frame is uint8 [H, W, 3] (RGB); got {arr.dtype} {list(arr.shape)}")
    if codec == "RAW":
        return arr
    quality = 95
    m = re.fullmatch(r"CODEC_JPEG_Q(\d{1,3})", codec)
    if m:
        quality = int(m.group(1))
        if not 1 <= quality <= 100:
            raise ValueError(f"codec {codec}: the quality is 1..100")
        codec = "JPEG"
    if codec not in ("PNG", "JPEG"):
        raise ValueError(f"codec {codec!r}: one of RAW, PNG, JPEG, CODEC_JPEG_Q<N> (LOSSLESS is sent by the TypeScript client only)")
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"codec {codec} encodes frames with Pillow: pip install Pillow (or send codec RAW)") from e
    out = io.BytesIO()
    img = Image.fromarray(np.ascontiguousarray(arr), "RGB")
    if codec == "JPEG":
        img.save(out, format="JPEG", quality=quality)
    else:
        img.save(out, format="PNG")
    return out.getvalue()


def encode_data(data: list, codec: str) -> list:
    """A list of datums with every ``observation.image`` frame encoded for ``codec`` (a new list; the input is not changed)."""
    out = []
    for i, datum in enumerate(data):
        if not isinstance(datum, dict):
            raise ValueError(f"data[{i}] is a {type(datum).__name__}; a datum is a dict with \"observation\" (and \"actions\" to train)")
        d = dict(datum)
        obs = d.get("observation")
        if isinstance(obs, dict) and isinstance(obs.get("image"), dict):
            obs = dict(obs)
            obs["image"] = {cam: encode_frame(f, codec) for cam, f in obs["image"].items()}
            d["observation"] = obs
        out.append(d)
    return out
