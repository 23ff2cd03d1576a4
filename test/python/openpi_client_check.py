"""Talks to a Vela policy server exactly as OpenPI's client does, and prints what it saw as JSON.

openpi_client.websocket_client_policy.WebsocketClientPolicy: websockets' sync client with
compression=None, max_size=None and "Authorization: Api-Key <key>"; metadata is the first
message; observations and answers are msgpack with numpy arrays as bin-keyed maps
(openpi_client.msgpack_numpy); a text frame is an error. This file re-implements that small
client so the test needs only websockets, msgpack, numpy and zstandard.

Usage: python3 openpi_client_check.py ws://127.0.0.1:PORT HTTP_BASE API_KEY
"""

import json
import sys
import urllib.request

import msgpack
import numpy as np
import websockets.sync.client
import zstandard


def pack_array(obj):
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"unsupported dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def unpack_array(obj):
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(obj):
    return msgpack.packb(obj, default=pack_array)


def unpackb(data):
    return msgpack.unpackb(data, object_hook=unpack_array)


def connect(uri, api_key):
    headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
    conn = websockets.sync.client.connect(uri, compression=None, max_size=None, additional_headers=headers)
    return conn, unpackb(conn.recv())


def infer(conn, data):
    conn.send(data)
    response = conn.recv()
    if isinstance(response, str):
        raise RuntimeError(f"Error in inference server:\n{response}")
    return unpackb(response)


def observation():
    """Two cameras, the wrist one channels-first, as the TS test builds them."""
    image = (np.arange(20 * 30 * 3) * 7 % 256).astype(np.uint8).reshape(20, 30, 3)
    wrist = (np.arange(3 * 24 * 16) * 13 % 256).astype(np.uint8).reshape(3, 24, 16)
    state = np.array([0.5, -1.25, 2, 0.75, -3, 1.5, 0.125], dtype=np.float32)
    return {
        "observation/image": image,
        "observation/wrist_image": wrist,
        "observation/state": state,
        "prompt": "pick up the bottle 0",
    }


def describe(answer):
    actions = answer["actions"]
    return {
        "type": type(actions).__name__,
        "dtype": actions.dtype.str,
        "shape": list(actions.shape),
        "values": actions.astype(np.float64).ravel().tolist(),
        "keys": sorted(answer.keys()),
        "policy_timing": sorted(answer["policy_timing"].keys()),
        "server_timing": sorted(answer["server_timing"].keys()),
        "timing_are_numbers": all(
            isinstance(v, (int, float)) for t in ("policy_timing", "server_timing") for v in answer[t].values()
        ),
    }


def main():
    uri, http_base, api_key = sys.argv[1], sys.argv[2], sys.argv[3]
    out = {}
    conn, metadata = connect(uri, api_key)
    out["metadata"] = metadata
    plain = packb(observation())
    first = infer(conn, plain)
    out["plain"] = describe(first)
    out["second"] = describe(infer(conn, plain))
    conn.close()

    request = urllib.request.Request(f"{http_base}/v1/observation.zdict", headers={"Authorization": f"Api-Key {api_key}"})
    dict_bytes = urllib.request.urlopen(request).read()
    zdict = zstandard.ZstdCompressionDict(dict_bytes)
    out["dict_id"] = zdict.dict_id()
    variants = {
        "zstd_dict": zstandard.ZstdCompressor(level=1, dict_data=zdict).compress(plain),
        "zstd_plain": zstandard.ZstdCompressor(level=1).compress(plain),
    }
    for name, data in variants.items():
        conn, _ = connect(uri, api_key)
        out[name] = describe(infer(conn, data))
        conn.close()

    # An error: a text frame, then the server closes the connection with 1011.
    conn, _ = connect(uri, api_key)
    bad = observation()
    bad["images"] = {"cam_left": bad.pop("observation/image")}
    try:
        infer(conn, packb(bad))
        out["error"] = None
    except RuntimeError as e:
        out["error"] = str(e)
    try:
        conn.recv()
    except websockets.ConnectionClosed as e:
        out["close_code"] = e.rcvd.code if e.rcvd else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
