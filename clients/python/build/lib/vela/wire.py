"""msgpack with numpy arrays as OpenPI encodes them (docs/PROTOCOL.md section 5).

An ``np.ndarray`` is the map ``{b"__ndarray__": True, b"data": <bytes>, b"dtype": <str>, b"shape":
<list>}`` (openpi_client.msgpack_numpy); a numpy scalar is ``{b"__npgeneric__": True, b"data",
b"dtype"}``. Object, void and complex arrays are refused: the server cannot read them.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np


def _pack(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"unsupported dtype {obj.dtype}: send numbers (float32, uint8, ...)")
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": list(arr.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__}")


def _unpack(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=tuple(obj[b"shape"]))
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(obj: Any) -> bytes:
    """One msgpack message; numpy arrays and scalars as OpenPI's maps. @raises ValueError / TypeError for what cannot be sent."""
    return msgpack.packb(obj, default=_pack, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """A message as Python values; OpenPI's array maps as read-only numpy arrays (views of ``data``)."""
    return msgpack.unpackb(data, object_hook=_unpack, raw=False, strict_map_key=False)


def open_websocket(uri: str, **kwargs: Any) -> Any:
    """``websockets.sync.client.connect(uri, **kwargs)``, held open past this call (closed by its owner's ``close``)."""
    import websockets.sync.client

    conn = websockets.sync.client.connect(uri, **kwargs)
    # websockets 17.1 warns on a connection not entered as a context manager; entering is all it asks.
    return conn.__enter__()
