"""The bench's Python path (bench/step.ts): one training session driven through the `vela` package,
one awaited step per line on stdin, as a user's loop writes it:

    s.forward_backward(data).result(); s.optim_step(learning_rate=1e-5).result()

Usage: python bench/python_step.py URL KEY PRESET FINETUNE DATUMS
  DATUMS: a msgpack file (OpenPI's ndarray encoding) of the session's datums as the package takes
  them: frames uint8 [H, W, 3] numpy arrays at the camera's size (the package shrinks them to the
  model's image_size and sends them with its default codec, RAW), state float32 [S], actions
  float32 [H, A], prompt.
Protocol: prints "ready <request bytes>" once the session is open; then for each "step" line on
stdin runs one awaited step and prints its milliseconds; "close" closes the session and exits.
"""

import sys
import time

import vela
from vela.frames import encode_data


def main() -> None:
    url, key, preset, finetune, path = sys.argv[1:6]
    with open(path, "rb") as f:
        data = vela.unpackb(f.read())
    options = {"finetune": finetune, "rank": 16, "alpha": 32, "targets": ["all"], "seed": 0} if finetune == "lora" else {"finetune": finetune, "seed": 0}
    client = vela.Vela(url, api_key=key)
    with client.training_session(base_model=preset, **options) as s:
        request = vela.packb({"id": 1, "op": "forward_backward", "data": encode_data(data, s.codec, s._image_size()), "codec": s.codec})
        print(f"ready {len(request)}", flush=True)
        for line in sys.stdin:
            if line.strip() == "close":
                break
            t0 = time.perf_counter()
            s.forward_backward(data).result()
            s.optim_step(learning_rate=1e-5).result()
            print(f"{(time.perf_counter() - t0) * 1000:.3f}", flush=True)


if __name__ == "__main__":
    main()
