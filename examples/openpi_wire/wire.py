"""OpenPI's websocket wire without the vela package (docs/PROTOCOL.md sections 5 and 6), for a robot
that cannot install it: numpy arrays as openpi_client's msgpack_numpy writes them, and one
request-answer exchange. Needs `pip install websockets msgpack numpy`.
"""
import msgpack
import numpy as np


def pack(x):
    """numpy arrays on the wire, as openpi_client.msgpack_numpy writes them."""
    if isinstance(x, np.ndarray):
        return {b"__ndarray__": True, b"data": x.tobytes(), b"dtype": x.dtype.str, b"shape": x.shape}
    return x


def unpack(m):
    if b"__ndarray__" in m:
        return np.ndarray(buffer=m[b"data"], dtype=np.dtype(m[b"dtype"]), shape=m[b"shape"])
    return m


def infer(ws, obs):
    """Sends one observation and returns the answer map (``actions`` float32 [action_horizon, action_dim])."""
    ws.send(msgpack.packb(obs, default=pack))
    answer = ws.recv()
    if isinstance(answer, str):                       # a text frame is an error, in words; then the
        raise RuntimeError(answer)                    # server closes (1011), as OpenPI's does: reconnect
    return msgpack.unpackb(answer, object_hook=unpack)
