"""The PyTorch side of the full-size pi0.5 benchmark (bench/real-pi-full.ts, Vela issue 23): loads a
Hub-layout checkpoint into the reference (reference.py) in float32, then times `sample()` on the
inputs the bench wrote, and writes one JSON result. The bench runs it in its own process, in turns
with Vela's, so that each side has the machine (and its memory) to itself.

    python3 scripts/real_pi/bench_sample.py --checkpoint DIR --inputs INPUTS.json --threads 2 --out RESULT.json

Loading mirrors Vela's reader (server/models/hub-checkpoint.ts) so that load time and peak RSS
compare like with like: the model is built on the meta device (no 13 GB random init), then each
tensor's bytes are read from the safetensors file by positioned reads (no mmap, whose touched pages
would count in RSS for as long as the file stays mapped), widened BF16 -> float32 and set as the
parameter; the expert's unused LM head is never read.

INPUTS.json (written by the bench): {"size": "full" | "tiny", "imageSize": S, "numCameras": nc,
"images": "<file of float32 [nc, 3, S, S], little-endian>", "tokens": [L], "tokenMasks": [L],
"noise": [ah * 32], "cameras": [1, 3], "runs": n, "warmup": w}. A run with c cameras uses the
first c images, every camera present.

RESULT.json: {"threads", "torch", "loadMs", "peakRssAfterLoadBytes", "peakRssBytes",
"float32WeightBytes", "params", "samples": [{"cameras", "warmupMs": [...], "ms": [...],
"cpuMs": [...], "actions": [ah * 32]}]}; peak RSS is VmHWM of /proc/self/status.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def vm_hwm_bytes() -> int:
    """Peak resident set of this process (VmHWM), in bytes."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) * 1024
    raise RuntimeError('/proc/self/status has no VmHWM line')


def load(model, ckpt: str) -> tuple[int, dict]:
    """Reads DIR/model.safetensors into `model` (built on the meta device), tensor by tensor.
    Returns (float32 bytes of the parameters set, count of tensors by on-disk dtype)."""
    import torch
    from write_random_checkpoint import hub_key

    path = os.path.join(ckpt, 'model.safetensors')
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(n))
    header.pop('__metadata__', None)
    base = 8 + n
    wanted = dict(model.named_parameters())
    layout = {hub_key(name): name for name in wanted}  # Hub key -> parameter (FACTS 2.2)
    missing = [key for key in layout if key not in header]
    if missing:
        raise SystemExit(f'{path}: no tensor {missing[:5]}')
    total, dtypes = 0, {}
    fd = os.open(path, os.O_RDONLY)
    try:
        # File order reads the disk sequentially; the peak is the parameters plus one tensor's
        # raw bytes and float32 copy in flight, whatever the order.
        for key, entry in sorted(header.items(), key=lambda kv: kv[1]['data_offsets'][0]):
            name = layout.get(key)
            if name not in wanted:
                continue  # the expert's unused LM head
            begin, end = entry['data_offsets']
            raw = bytearray(end - begin)
            view = memoryview(raw)
            done = 0
            while done < len(raw):
                got = os.preadv(fd, [view[done:]], base + begin + done)
                if got == 0:
                    raise SystemExit(f'{path}: ends early inside {key}')
                done += got
            dt = {'BF16': torch.bfloat16, 'F32': torch.float32, 'F16': torch.float16}[entry['dtype']]
            t = torch.frombuffer(raw, dtype=dt).reshape(entry['shape']).float()  # a copy: raw is freed
            del raw, view
            if list(t.shape) != list(wanted[name].shape):
                raise SystemExit(f'{key} is {list(t.shape)}; the model expects {list(wanted[name].shape)}')
            mod_name, _, attr = name.rpartition('.')
            setattr(model.get_submodule(mod_name), attr, torch.nn.Parameter(t, requires_grad=False))
            total += t.numel() * 4
            dtypes[entry['dtype']] = dtypes.get(entry['dtype'], 0) + 1
    finally:
        os.close(fd)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise SystemExit(f'parameters not loaded: {left[:5]}')
    return total, dtypes


def main() -> None:
    ap = argparse.ArgumentParser(description='PyTorch side of bench/real-pi-full.ts: load a Hub-layout pi0.5 and time sample().')
    ap.add_argument('--checkpoint', required=True, help='Hub-layout folder (config.json, model.safetensors)')
    ap.add_argument('--inputs', required=True, help='inputs JSON written by the bench')
    ap.add_argument('--threads', type=int, required=True, help='torch.set_num_threads (Vela\'s TF intra-op threads)')
    ap.add_argument('--out', required=True, help='result JSON')
    a = ap.parse_args()

    import torch

    # Before any parallel work: one intra-op pool of this size, one inter-op thread (as Vela's TF).
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    import numpy as np
    import reference as R

    with open(a.inputs) as f:
        inp = json.load(f)
    cfg = {'full': R.REAL_PI05, 'tiny': R.REAL_PI_TINY_PI05}[inp['size']]
    S = cfg.vision.imageSize
    if inp['imageSize'] != S:
        raise SystemExit(f'inputs are {inp["imageSize"]} px; the {inp["size"]} pi0.5 takes {S}')

    # Library start-up is outside both sides' load times (Vela's starts after TensorFlow loads):
    # torch's first module construction pays a one-time ~1-3 s of lazy initialisation.
    with torch.device('meta'):
        R.RealPi(R.REAL_PI_TINY_PI05)
    t0 = time.perf_counter()
    with torch.device('meta'):
        model = R.RealPi(cfg)
    weight_bytes, dtypes = load(model, a.checkpoint)
    model.eval()
    load_ms = (time.perf_counter() - t0) * 1e3
    peak_load = vm_hwm_bytes()

    images = np.fromfile(os.path.join(os.path.dirname(a.inputs), inp['images']), dtype='<f4').reshape(inp['numCameras'], 3, S, S)
    tokens = torch.tensor(inp['tokens'], dtype=torch.int32)[None]
    token_masks = torch.tensor(inp['tokenMasks'], dtype=torch.int32)[None]
    noise = torch.tensor(inp['noise'], dtype=torch.float32).reshape(1, cfg.actionHorizon, cfg.actionDim)
    state = torch.zeros(1, cfg.actionDim)  # pi0.5 reads its state from the prompt; unused
    samples = []
    with torch.inference_mode():
        for cams in inp['cameras']:
            img = torch.from_numpy(images[:cams].copy())[None]  # [1, c, 3, S, S]
            masks = torch.ones(1, cams, dtype=torch.int32)
            times, cpu, warm, out = [], [], [], None
            for r in range(inp['warmup'] + inp['runs']):
                t1, c1 = time.perf_counter(), time.process_time()
                out = model.model.sample(img, masks, tokens, token_masks, state, noise)
                c2 = time.process_time()  # user + system, every thread of the process
                (warm if r < inp['warmup'] else times).append((time.perf_counter() - t1) * 1e3)
                if r >= inp['warmup']:
                    cpu.append((c2 - c1) * 1e3)
            samples.append({'cameras': cams, 'warmupMs': warm, 'ms': times, 'cpuMs': cpu, 'actions': out.flatten().tolist()})
            print(f'torch: {cams} camera(s): sample {", ".join(f"{t:.0f}" for t in times)} ms', file=sys.stderr, flush=True)

    res = {
        'threads': torch.get_num_threads(),
        'torch': torch.__version__,
        'loadMs': load_ms,
        'peakRssAfterLoadBytes': peak_load,
        'peakRssBytes': vm_hwm_bytes(),
        'float32WeightBytes': weight_bytes,
        'params': weight_bytes // 4,
        'dtypes': dtypes,
        'samples': samples,
    }
    with open(a.out + '.tmp', 'w') as f:
        json.dump(res, f)
    os.replace(a.out + '.tmp', a.out)


if __name__ == '__main__':
    main()
