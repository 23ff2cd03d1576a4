"""Camera frames as the session ops and the policy server take them (docs/PROTOCOL.md section 3).

A frame is a numpy ``uint8`` array ``[H, W, 3]`` (RGB). The model sees ``image_size`` x
``image_size`` pictures (the session's greeting and the policy's metadata say the size), made by
:func:`resize_with_pad`: LeRobot's pre-processing (aspect kept, bilinear, centred black padding),
specified to the bit in docs/MODEL.md (D12) so that the server, which resizes any other size the
same way, computes the same pixels. The package resizes before sending, so a 480x640 camera
frame crosses the socket as 96x96 or 224x224 pixels rather than 922 kB.

With codec ``"RAW"`` a frame is sent as an ndarray; ``"PNG"``, ``"JPEG"`` and ``"CODEC_JPEG_Q<N>"``
encode it here with Pillow (``pip install Pillow``). Bytes given as a frame are sent untouched
(already encoded with the request's codec, at any size: the server resizes them).
"""

from __future__ import annotations

import functools
import io
import re
from typing import Any, Dict, List, Optional

import numpy as np

CODECS = ("RAW", "PNG", "JPEG")


def _taps(n_in: int, n_out: int):
    """PyTorch's bilinear source taps with align_corners=False, in float64 (protocol/resize.ts's ``taps``)."""
    s = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.floor(s).astype(np.intp)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    w1 = s - i0
    return i0, i1, 1.0 - w1, w1


# A plan holds 64 bytes per output value (8 arrays): 9.6 MB at 224. Past 256 x 256 (12.6 MB) one
# is made for the call and dropped, so resizing to a large size cannot keep gigabytes cached
# (eight plans of 2048 were 6.4 GB).
_PLAN_CACHE_MAX_VALUES = 256 * 256 * 3


def _plan(h: int, w: int, size: int):
    """For an ``[h, w, 3]`` frame: the geometry, and per output value (``rh * rw * 3``, C order) the flat
    indices of its four source values and their weights, so a resize is four 1-D gathers (a camera's
    frames all share one plan; 2-3x faster than gathering pixels)."""
    ratio = max(w / size, h / size)
    rw, rh = max(1, int(w / ratio)), max(1, int(h / ratio))
    y0, y1, wy0, wy1 = _taps(h, rh)
    x0, x1, wx0, wx1 = _taps(w, rw)
    channel = np.arange(3)
    index = [((ys[:, None, None] * w + xs[None, :, None]) * 3 + channel).ravel() for ys in (y0, y1) for xs in (x0, x1)]
    per_x = lambda wx: np.broadcast_to(wx[None, :, None], (rh, rw, 3)).ravel()
    per_y = lambda wy: np.broadcast_to(wy[:, None, None], (rh, rw, 3)).ravel()
    return rh, rw, int((size - rh) / 2), int((size - rw) / 2), index, (per_x(wx0), per_x(wx1), per_y(wy0), per_y(wy1))


_cached_plan = functools.lru_cache(maxsize=8)(_plan)  # a camera's frames all share one


def as_rgb(frame: Any) -> Optional[np.ndarray]:
    """``frame`` read as the server reads a RAW ndarray (protocol/frames.ts ``decodeRaw``), or None.

    The server takes uint8 ``[H, W, C]`` or ``[C, H, W]`` with C in 1, 3, 4 (channels-last wins
    when both readings fit) or ``[H, W]``, replicates gray to RGB and drops alpha; a frame shrunk
    here must be that picture, or the model would see another one than for the whole frame.

    Args:
        frame: a numpy array (any layout the server takes).
    Returns:
        uint8 ``[H, W, 3]``, a view where it can be (gray is broadcast, not copied); None for
        another dtype or shape (the server answers those with ``bad_frame``).
    """
    arr = np.asarray(frame)
    if arr.dtype != np.uint8:
        return None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif arr.ndim != 3:
        return None
    elif arr.shape[2] not in (1, 3, 4):
        if arr.shape[0] not in (1, 3, 4):
            return None
        arr = np.moveaxis(arr, 0, -1)
    if arr.shape[2] == 1:
        return np.broadcast_to(arr, arr.shape[:2] + (3,))
    return arr[:, :, :3]


def _shrinks(rgb: np.ndarray, size: Optional[int]) -> bool:
    """Whether a frame goes through :func:`resize_with_pad` before sending: larger than ``size``
    and not empty (an empty one is sent whole, for the server to refuse as it would anyway)."""
    return size is not None and min(rgb.shape[0], rgb.shape[1]) >= 1 and max(rgb.shape[0], rgb.shape[1]) > size


def resize_with_pad(frame: Any, size: int) -> np.ndarray:
    """``frame`` resized to fit ``size`` x ``size`` with its aspect kept, padded with black, centred.

    LeRobot's ``resize_with_pad_torch`` (``F.interpolate(mode="bilinear", align_corners=False)``,
    no antialias, rounded half to even) written out in float64 in the order the server computes
    it (protocol/resize.ts), so the two give the same bytes: ratio = max(W / size, H / size), the
    picture resized to int(W / ratio) x int(H / ratio), placed at int((size - side) / 2). About
    0.4 ms for a 480x640 frame to 96 and 2 ms to 224 on one core.

    Args:
        frame: uint8 ``[H, W, 3]`` RGB.
        size: the model's ``image_size`` (pixels).
    Returns:
        uint8 ``[size, size, 3]``; the frame itself (not a copy) when it is already that size.
    @raises ValueError: a frame that is not uint8 ``[H, W, 3]`` or a size that is not a positive integer.
    """
    arr = np.asarray(frame)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"a frame is uint8 [H, W, 3] (RGB); got {arr.dtype} {list(arr.shape)}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size {size!r} is not a positive integer")
    h, w = arr.shape[:2]
    if h == size and w == size:
        return arr
    return _resize_alike([arr], int(size))[0]


def _resize_alike(frames: List[np.ndarray], size: int) -> List[np.ndarray]:
    """:func:`resize_with_pad` of frames of one shape (uint8 ``[H, W, 3]``, checked by the caller),
    with the arithmetic done once for all of them: the same bytes per frame, about a third of the
    time of one call each (a batch's camera frames share a shape)."""
    h, w = frames[0].shape[:2]
    plan = _cached_plan if size * size * 3 <= _PLAN_CACHE_MAX_VALUES else _plan
    rh, rw, top, left, index, (wx0, wx1, wy0, wy1) = plan(h, w, size)
    taps = [np.empty((len(frames), index[0].size), dtype=np.uint8) for _ in index]
    for k, frame in enumerate(frames):
        flat = np.ascontiguousarray(frame).reshape(-1)
        for tap, i in zip(taps, index):
            np.take(flat, i, out=tap[k])
    p00, p01, p10, p11 = taps
    # w0y * (w0x * p00 + w1x * p01) + w1y * (w0x * p10 + w1x * p11): protocol/resize.ts's order (uint8 times float64 is exact).
    values = wy0 * (wx0 * p00 + wx1 * p01) + wy1 * (wx0 * p10 + wx1 * p11)
    out = np.zeros((len(frames), size, size, 3), dtype=np.uint8)
    out[:, top:top + rh, left:left + rw] = np.rint(values).reshape(len(frames), rh, rw, 3)  # half to even, as torch.round; never past 255
    return list(out)


def _readable(frame: Any) -> np.ndarray:
    """``frame`` as :func:`as_rgb` reads it. @raises ValueError: a layout the server does not read."""
    arr = np.asarray(frame)
    rgb = as_rgb(arr)
    if rgb is None:
        raise ValueError(f"a frame is uint8 [H, W, 3] (RGB), [3, H, W] or [H, W]; got {arr.dtype} {list(arr.shape)}")
    return rgb


def encode_frame(frame: Any, codec: str, image_size: Optional[int] = None) -> Any:
    """``frame`` (uint8 ``[H, W, 3]``, ``[3, H, W]``, ``[H, W]`` or any layout :func:`as_rgb`
    reads, or bytes already encoded) as the wire value for ``codec``, first shrunk with
    :func:`resize_with_pad` when ``image_size`` is given and the frame is larger.

    With PNG or JPEG the frame is shrunk and then encoded: PNG gives the server the shrunk frame's
    bytes, JPEG those through its loss (which differ from a whole frame's JPEG, resized there).

    @raises ValueError: a frame that is not a uint8 layout the server reads, or an unknown codec.
    @raises ImportError: PNG / JPEG without Pillow.
    """
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return bytes(frame)
    rgb = _readable(frame)
    if _shrinks(rgb, image_size):
        return _encode(rgb, rgb, codec)
    return _encode(np.asarray(frame), rgb, codec)


def _encode(arr: np.ndarray, rgb: np.ndarray, codec: str) -> Any:
    """The wire value of a frame for ``codec``: ``arr`` itself for RAW (the server reads any layout
    as ``rgb``), else ``rgb`` encoded by Pillow."""
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
    img = Image.fromarray(np.ascontiguousarray(rgb), "RGB")
    if codec == "JPEG":
        img.save(out, format="JPEG", quality=quality)
    else:
        img.save(out, format="PNG")
    return out.getvalue()


def encode_data(data: list, codec: str, image_size: Optional[int] = None) -> list:
    """A list of datums with every ``observation.image`` frame shrunk to ``image_size`` (when
    given and larger) and encoded for ``codec`` (a new list; the input is not changed). Frames of
    one shape are shrunk together (:func:`_resize_alike`).

    @raises ValueError: a datum that is not a dict, or a frame as :func:`encode_frame` says.
    """
    images: List[Optional[Dict[str, Any]]] = []
    readable: Dict[tuple, np.ndarray] = {}  # (datum, camera) -> the frame as the server reads it
    alike: Dict[tuple, List[tuple]] = {}  # frame shape -> (datum, camera, rgb) to shrink
    for i, datum in enumerate(data):
        if not isinstance(datum, dict):
            raise ValueError(f"data[{i}] is a {type(datum).__name__}; a datum is a dict with \"observation\" (and \"actions\" to train)")
        obs = datum.get("observation")
        frames = obs.get("image") if isinstance(obs, dict) else None
        images.append(dict(frames) if isinstance(frames, dict) else None)
        for cam, f in (frames or {}).items() if isinstance(frames, dict) else ():
            if isinstance(f, (bytes, bytearray, memoryview)):
                continue
            rgb = readable[(i, cam)] = _readable(f)
            if _shrinks(rgb, image_size):
                alike.setdefault(rgb.shape, []).append((i, cam, rgb))
    shrunk: Dict[tuple, np.ndarray] = {}
    for group in alike.values():
        for (i, cam, _), small in zip(group, _resize_alike([rgb for _, _, rgb in group], int(image_size))):  # type: ignore[arg-type]
            shrunk[(i, cam)] = small

    def _wire(i: int, cam: str, f: Any) -> Any:
        if (i, cam) in shrunk:
            return _encode(shrunk[(i, cam)], shrunk[(i, cam)], codec)
        if (i, cam) in readable:
            return _encode(np.asarray(f), readable[(i, cam)], codec)
        return bytes(f)  # already encoded with the request's codec

    out = []
    for i, datum in enumerate(data):
        d = dict(datum)
        frames = images[i]
        if frames is not None:
            obs = dict(d["observation"])
            obs["image"] = {cam: _wire(i, cam, f) for cam, f in frames.items()}
            d["observation"] = obs
        out.append(d)
    return out
