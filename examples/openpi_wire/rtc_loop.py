"""The README's real-time chunking loop (vela.RealTimeChunking) without the package, on the wire:
a thread asks for the next chunk once execute_horizon actions of the current one have run, and
splices the answer in at the row due now (docs/PROTOCOL.md section 6).

Usage: python rtc_loop.py   (edit url and the two "replace" functions; needs wire.py beside it)
"""
import threading
import time

import msgpack
import numpy as np
from websockets.sync.client import connect

import wire

url = "ws://127.0.0.1:8000"
control_hz, execute_horizon, ticks = 30, 8, 300     # 30 Hz; ask again after 8 actions of a chunk; a 10 s run

def get_observation():                               # replace: your robot's cameras and state, now
    return {"observation/cam_high": np.zeros((480, 640, 3), np.uint8),
            "observation/state": np.zeros(26, np.float32),
            "prompt": "Pick up the yellow bottle on the table."}

def robot_step(action):                              # replace: command one action [action_dim], raw units
    pass

lock = threading.Condition()
chunk, index, done = None, 0, 0    # the chunk executed [action_horizon, action_dim]; the index of its action due; actions run
stop, failed = False, []

def request_chunks(ws):
    global chunk, index
    try:
        while True:
            with lock:                               # wait until execute_horizon actions of this chunk have run
                lock.wait_for(lambda: stop or chunk is None or index >= execute_horizon)
                if stop:
                    return
                executed = None if chunk is None else index  # the index of the action due at the capture
                done_at_capture = done
            obs = get_observation()                  # the robot goes on with the old chunk meanwhile
            obs["rtc/control_hz"] = control_hz
            if executed is not None:                 # None: the first request, no previous answer
                obs["rtc/executed"] = executed
            answer = wire.infer(ws, obs)
            with lock:
                k = done - done_at_capture           # actions run since the capture: the true delay
                chunk, index = answer["actions"], k  # row 0 was due at the capture: go on with row k
            rtc = answer["server_timing"].get("rtc", {"mode": "plain"})   # "off" says why in rtc["reason"]
            print(f"asked at action {executed}, spliced at row {k}, rtc {rtc['mode']} (delay {rtc.get('delay')})")
    except Exception as e:
        failed.append(e)
        with lock:
            lock.notify_all()

with connect(url, max_size=None, compression=None) as ws:
    msgpack.unpackb(ws.recv())                       # the metadata
    thread = threading.Thread(target=request_chunks, args=(ws,))
    thread.start()
    late, next_tick = 0, time.monotonic()
    for tick in range(ticks):
        with lock:
            action = chunk[index] if chunk is not None and index < len(chunk) else None
            if action is not None:
                index, done = index + 1, done + 1
                lock.notify()
        if failed:
            raise failed[0]
        if action is None:
            late += 1                                # no chunk yet, or the answer is later than the chunk lasts: hold
        else:
            robot_step(action)
        next_tick += 1 / control_hz
        time.sleep(max(0.0, next_tick - time.monotonic()))
    with lock:
        stop = True
        lock.notify()
    thread.join()
    print(f"{done} actions in {ticks} ticks; {late} ticks without one")
