"""OpenPI-style clients that send states in and far out of a policy's norm stats, and print what
they saw as JSON (test/policy-range.test.ts). The client is openpi_client_check.py's (OpenPI's
WebsocketClientPolicy re-implemented on websockets, msgpack and numpy).

Usage: python3 openpi_range_check.py ws://127.0.0.1:PORT STATE_DIM

Connections, in order, each closed before the next opens:
  degrees: two observations whose state is in degrees (the stats are radians)
  radians: two observations of the same state in radians
  again:   one observation in degrees again, on a new connection
"""

import json
import math
import sys

import numpy as np

from openpi_client_check import connect, infer, packb


def observation(state):
    image = (np.arange(24 * 32 * 3, dtype=np.uint32) * 7 % 256).astype(np.uint8).reshape(24, 32, 3)
    return {"observation/image": image, "observation/state": np.asarray(state, dtype=np.float32), "prompt": "pick up the cube"}


def run(uri, state, n):
    conn, _metadata = connect(uri, None)
    try:
        seen = []
        for _ in range(n):
            answer = infer(conn, packb(observation(state)))
            seen.append({"keys": sorted(answer.keys()), "shape": list(answer["actions"].shape), "finite": bool(np.isfinite(answer["actions"]).all()), "warnings": answer.get("warnings")})
        return seen
    finally:
        conn.close()


def main():
    uri, dim = sys.argv[1], int(sys.argv[2])
    radians = [0.3 * math.sin(j + 1) for j in range(dim)]
    radians[1] = 1.2  # one joint well away from its mean: 69 degrees
    degrees = [math.degrees(x) for x in radians]
    print(json.dumps({"degrees": run(uri, degrees, 2), "radians": run(uri, radians, 2), "again": run(uri, degrees, 1), "state_degrees": degrees}))


if __name__ == "__main__":
    main()
