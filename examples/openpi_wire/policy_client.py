"""The README's policy client (vela.WebsocketClientPolicy) without the package, on the wire.

Usage: python policy_client.py   (edit url and api_key below; needs wire.py beside it)
"""
import msgpack
import numpy as np
from websockets.sync.client import connect

from wire import infer

url, api_key = "ws://127.0.0.1:8000", None            # vela policy: no key unless --api-key
# url, api_key = "ws://127.0.0.1:8080/v1/fine-tunes/<id>/policy", "my-key"   # a job's policy on vela serve
headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
with connect(url, max_size=None, compression=None, additional_headers=headers) as ws:
    metadata = msgpack.unpackb(ws.recv())             # first message: what the policy expects
    print(metadata["cameras"], metadata["state_dim"], metadata["action_horizon"], metadata["action_dim"])
    obs = {
        "observation/cam_high": np.zeros((480, 640, 3), np.uint8),          # one frame per camera, any size: the
                                                                             # server resizes (MODEL.md D12)
        "observation/state": np.zeros(metadata["state_dim"], np.float32),   # the robot's raw state (zeros: far outside
                                                                             # the G1 sample's stats, so the server warns once)
        "prompt": "Pick up the yellow bottle on the table.",
    }
    actions = infer(ws, obs)["actions"]
    print(actions.shape, actions.dtype)               # (16, 26) float32 for the G1 sample
