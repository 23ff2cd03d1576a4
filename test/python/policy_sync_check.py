"""A robot and a trainer at once: OpenPI clients (openpi_client_check.py's WebsocketClientPolicy
re-implementation) stay connected to a running `vela policy` while an xorl-style client
(xorl_client_check.py) trains a model on a Vela server and syncs its weights into that policy
server 5 times (xorl's add_inference_endpoint + sync_inference_weights).

- A background connection sends observations without pause the whole time: it must see no
  error and no closed connection.
- After each sync, a second connection (stream "check") asks once; its n-th request samples
  from the seed that the policy server's documented rule gives (--seed S: the first 4 bytes of
  SHA-256("vela-policy-seed:S:check:n"), little-endian), and the same observation is sampled
  on the Vela model with that seed: the actions must be equal, float for float.
- The same for the model's own live policy: HTTP inference with a seed, and its websocket with
  ?seed=&stream=.
- Then a bfloat16 sync: actions close to, not necessarily equal to, the float32 ones.

Usage: python3 policy_sync_check.py VELA_BASE API_KEY MODEL_ID POLICY_WS_URL POLICY_KEY POLICY_SEED
Prints what it saw as JSON. Needs websockets, msgpack, numpy (zstandard for the imported client).
"""

import hashlib
import json
import os
import sys
import threading
import time

import numpy as np
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openpi_client_check import connect, infer, packb  # noqa: E402
from xorl_client_check import HttpError, XorlClient, datum, train_step  # noqa: E402


def request_seed(seed, stream, n):
    digest = hashlib.sha256(f"vela-policy-seed:{seed}:{stream}:{n}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def observation():
    """datum(0)'s frame, state and prompt, as an OpenPI observation."""
    d = datum(0)["observation"]
    img = d["image"]["cam_high"]
    return {
        "images": {"cam_high": np.array(img["data"], dtype=np.uint8).reshape(img["shape"])},
        "state": np.array(d["state"], dtype=np.float32),
        "prompt": d["prompt"],
    }


def sampled(client, model_id, seed):
    """The model's own sample of the same observation with `seed`, as float32 [16, A]."""
    obs = datum(0)["observation"]
    out = client.op("sample", {"model_id": model_id, "data": [{"observation": obs}], "codec": "RAW", "seed": seed})
    a = out["actions"]
    return np.array(a["data"], dtype=np.float32).reshape(a["shape"])[0]


class Background(threading.Thread):
    """Sends observations back to back on its own connection until stopped."""

    def __init__(self, url, key):
        super().__init__(daemon=True)
        self.conn, _ = connect(url + "?stream=bg", key)
        self.stop = threading.Event()
        self.answers = 0
        self.errors = []

    def run(self):
        data = packb(observation())
        while not self.stop.is_set():
            try:
                a = infer(self.conn, data)
                assert a["actions"].shape[0] == 16
                self.answers += 1
            except Exception as e:  # noqa: BLE001 - any failure is what the test looks for
                self.errors.append(f"{type(e).__name__}: {e}")
                return


def main():
    base, api_key, model_id, policy_url, policy_key, policy_seed = sys.argv[1:7]
    policy_seed = int(policy_seed)
    c = XorlClient(base, api_key)
    out = {"syncs": []}
    out["endpoint"] = c.call("POST", "/add_inference_endpoint", {"url": policy_url, "api_key": policy_key, "name": "robot-1"})
    out["endpoints"] = c.call("GET", "/list_inference_endpoints")

    check, metadata = connect(policy_url + "?stream=check", policy_key)
    out["metadata"] = metadata
    bg = Background(policy_url, policy_key)
    bg.start()
    data = packb(observation())
    n = 0

    def compare(label, sync=None, exact=True):
        nonlocal n
        seed = request_seed(policy_seed, "check", n)
        n += 1
        got = infer(check, data)["actions"]
        want = sampled(c, model_id, seed)
        row = {
            "label": label, "seed": seed, "shape": list(got.shape), "dtype": got.dtype.str,
            "equal": bool(np.array_equal(got, want)), "max_abs_diff": float(np.max(np.abs(got.astype(np.float64) - want))),
            "first": float(got[0, 0]),
        }
        if sync is not None:
            row["sync"] = sync
        out["syncs"].append(row)

    compare("initial")  # the checkpoint vela policy started from: the model before any sync
    for i in range(1, 6):
        out.setdefault("steps", []).append(train_step(c, model_id, i))
        time.sleep(0.2)  # let the background connection run between training and sync
        sync = c.post("sync_inference_weights", {"model_id": model_id})
        compare(f"sync {i}", sync)

    # The model's live policy over HTTP and over its websocket, with seeds of the caller's choosing.
    ts_id = c.post("weights_info", {"model_id": model_id})["training_session_id"]
    obs_json = {"images": {"cam_high": datum(0)["observation"]["image"]["cam_high"]}, "state": datum(0)["observation"]["state"], "prompt": "pick up the bottle", "seed": 123}
    live = c.call("POST", f"/v1/training_sessions/{ts_id}/infer", obs_json)
    got = np.array(live["actions"]["data"], dtype=np.float32).reshape(live["actions"]["shape"])
    out["live_http"] = {"equal": bool(np.array_equal(got, sampled(c, model_id, 123))), "cold_start": live["cold_start"], "weights_version": live["weights_version"], "keys": sorted(live.keys())}
    ws_base = base.replace("http", "ws", 1)
    live_conn, live_meta = connect(f"{ws_base}/v1/training_sessions/{ts_id}/policy?seed=5&stream=live", api_key)
    got = infer(live_conn, data)["actions"]
    out["live_ws"] = {"equal": bool(np.array_equal(got, sampled(c, model_id, request_seed(5, "live", 0)))), "live": live_meta.get("live")}
    live_conn.close()

    # Transfer precision: bfloat16 weights give close, not exact, actions; fp8 is not offered.
    out["quantization"] = c.post("set_sync_quantization", {"quantization": "bf16"})
    compare("bf16", c.post("sync_inference_weights", {"model_id": model_id}))
    try:
        c.post("set_sync_quantization", {"quantization": "fp8"})
        out["fp8"] = None
    except HttpError as e:
        out["fp8"] = {"status": e.status, "error": e.body["error"]}

    bg.stop.set()
    bg.join(timeout=30)
    out["background"] = {"answers": bg.answers, "errors": bg.errors}
    # Both long-lived connections are still open and answering.
    infer(check, data)
    infer(bg.conn, data)
    for conn in (check, bg.conn):
        conn.close()
    out["closed_cleanly"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except websockets.ConnectionClosed as e:
        print(json.dumps({"connection_closed": str(e)}))
        raise
