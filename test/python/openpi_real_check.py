"""Plays a robot against `vela policy` serving a real pi0 / pi0.5, as OpenPI's client does, and
prints what it saw as JSON.

The client is openpi_client.websocket_client_policy.WebsocketClientPolicy's protocol (see
openpi_client_check.py, whose helpers this imports): metadata first, msgpack-numpy
observations, a text frame is an error. The observation is one real frame of the G1 sample
(RGB uint8 [480, 640, 3], written by the test as raw bytes), its 26-dim state and its task.

Usage: python3 openpi_real_check.py ws://127.0.0.1:PORT/ SEED FRAME.bin OBS.json [API_KEY]
"""

import json
import math
import sys
import time

import numpy as np
import websockets

from openpi_client_check import connect, infer, packb


def describe(answer, rt_ms):
    actions = answer["actions"]
    values = actions.astype(np.float64).ravel().tolist()
    return {
        "dtype": actions.dtype.str,
        "shape": list(actions.shape),
        "values": values,
        "finite": all(math.isfinite(v) for v in values),
        "keys": sorted(answer.keys()),
        "round_trip_ms": rt_ms,
    }


def timed(conn, data):
    t0 = time.perf_counter()
    answer = infer(conn, data)
    return describe(answer, (time.perf_counter() - t0) * 1000)


def main():
    uri, seed, frame_file, obs_file = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    api_key = sys.argv[5] if len(sys.argv) > 5 else None
    meta = json.load(open(obs_file))
    frame = np.fromfile(frame_file, dtype=np.uint8).reshape(meta["shape"])
    observation = {
        "observation/image": frame,
        "observation/state": np.array(meta["state"], dtype=np.float32),
        "prompt": meta["prompt"],
    }
    data = packb(observation)
    seeded = f"{uri}?seed={seed}"
    out = {}

    # Two connections with the same seed: the same request n draws the same noise.
    a, metadata = connect(seeded, api_key)
    out["metadata"] = {k: v for k, v in metadata.items() if isinstance(v, (int, float, str, list, bool)) or v is None}
    out["first"] = timed(a, data)
    out["next"] = timed(a, data)
    b, _ = connect(seeded, api_key)
    out["again"] = timed(b, data)

    # A state with more dims than the model's: one error line, close 1011; b and the server go on.
    bad = dict(observation)
    bad["observation/state"] = np.zeros(metadata["state_dim"] + 1, dtype=np.float32)
    c, _ = connect(seeded, api_key)
    try:
        infer(c, packb(bad))
        out["misfit"] = {"error": None}
    except RuntimeError as e:
        out["misfit"] = {"error": str(e)}
    try:
        c.recv()
    except websockets.ConnectionClosed as e:
        out["misfit"]["close_code"] = e.rcvd.code if e.rcvd else None
    out["open_connection_after_misfit"] = timed(b, data)
    d, _ = connect(seeded, api_key)
    out["new_connection_after_misfit"] = timed(d, data)
    for conn in (a, b, d):
        conn.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
