"""safetensors fixtures for test/safetensors.test.ts, written by the Python `safetensors` package
(its Rust core), so the tests compare our bytes with the reference implementation's.

Run: python3 scripts/make_safetensors_fixtures.py  (needs safetensors, numpy, torch; the tests do not.)
Writes into test/vectors/safetensors/:
- f32_meta.safetensors: F32 tensors (scalar, empty, 1-D..3-D; names out of order) + {"format": "pt"}
  (one metadata key: with more, the Rust library writes them in a per-run hash order)
- f32_plain.safetensors: the same tensors without metadata
- mixed.safetensors: one tensor per dtype I64 F64 F32 I32 BF16 F16 U8 BOOL, awkward values
  (subnormals, infinities, NaN, rounding ties, int64 beyond 2^53), metadata with several keys,
  quotes, backslashes, control characters and non-ASCII text
- expected.json: every tensor's dtype, shape and values (floats as numbers or "nan"/"inf"/"-inf",
  int64 as decimal strings), every file's metadata, and the inputs that the F16/BF16 tensors were
  rounded from, to test our float32 -> F16/BF16 rounding against torch's
"""
import json
import os

import numpy as np
import torch
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import save_file as torch_save_file

DIR = os.path.join(os.path.dirname(__file__), '..', 'test', 'vectors', 'safetensors')


def f32_tensors():
    return {
        'model.layers.1.w': (np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.25 - 3).astype(np.float32),
        'model.layers.0.w': np.array([[1.5, -2.0, 3.25], [1e-30, -0.0, 6.0e7]], dtype=np.float32),
        'bias': np.array([0.1, -0.2, 0.3, np.float32(1 / 3)], dtype=np.float32),
        'Z.scalar': np.array(np.float32(2.718281828)),
        'empty': np.zeros((0, 3), dtype=np.float32),
        'a.bias': np.array([np.pi], dtype=np.float32),
    }


def floats(a):
    out = []
    for x in np.asarray(a, dtype=np.float64).reshape(-1):
        out.append('nan' if np.isnan(x) else ('inf' if x == np.inf else ('-inf' if x == -np.inf else float(x))))
    return out


def describe(tensors):
    out = {}
    for name, t in tensors.items():
        dtype = {torch.int64: 'I64', torch.float64: 'F64', torch.float32: 'F32', torch.int32: 'I32',
                 torch.bfloat16: 'BF16', torch.float16: 'F16', torch.uint8: 'U8', torch.bool: 'BOOL'}[t.dtype]
        if dtype == 'I64':
            values = [str(int(x)) for x in t.reshape(-1).tolist()]
        elif dtype in ('I32', 'U8'):
            values = [int(x) for x in t.reshape(-1).tolist()]
        elif dtype == 'BOOL':
            values = [1 if x else 0 for x in t.reshape(-1).tolist()]
        else:
            values = floats(t.to(torch.float64).numpy())
        out[name] = {'dtype': dtype, 'shape': list(t.shape), 'values': values}
    return out


def main():
    os.makedirs(DIR, exist_ok=True)
    f32 = f32_tensors()
    np_save_file(f32, os.path.join(DIR, 'f32_meta.safetensors'), metadata={'format': 'pt'})
    np_save_file(f32, os.path.join(DIR, 'f32_plain.safetensors'))

    # float32 inputs for the F16 / BF16 tensors: ties, subnormals, overflow, signed zero, NaN.
    half_src = np.array([1.0, -2.5, 65504.0, 65520.0, 1e5, 6.0e-8, 2.9802322e-08, 5.9604645e-08 * 1.5,
                         1.0009765625 + 2 ** -11, 1.0 + 2 ** -11, -0.0, np.inf, np.nan, 3.14159265, 1e-5, -7e-6],
                        dtype=np.float32)
    bf16_src = np.array([1.0, -2.5, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 3.4e38, 1e-40, -0.0, -np.inf, np.nan,
                         3.14159265, 1e-20, 65536.5], dtype=np.float32)
    mixed = {
        'int64': torch.tensor([[0, -1], [2 ** 53 + 1, -(2 ** 62)]], dtype=torch.int64),
        'f64': torch.tensor([np.pi, -1e300, 5e-324, np.inf], dtype=torch.float64),
        'f32': torch.tensor([[1.0, -0.5], [np.nan, 1e-45]], dtype=torch.float32),
        'i32': torch.tensor([2 ** 31 - 1, -(2 ** 31), 0, 7], dtype=torch.int32),
        'bf16': torch.from_numpy(bf16_src).to(torch.bfloat16),
        'f16': torch.from_numpy(half_src).to(torch.float16).reshape(4, 4),
        'u8': torch.tensor([0, 1, 127, 255], dtype=torch.uint8),
        'flags': torch.tensor([[True, False, True]], dtype=torch.bool),
        'scalar_f16': torch.tensor(0.333, dtype=torch.float16),
    }
    meta = {'format': 'pt', 'note': 'quote " backslash \\ newline \n tab \t bell \x07', 'unicode': 'π ≈ 3.14 🤖'}
    # The Rust library writes metadata keys in a per-process hash order; we write them sorted.
    # Retry until its order is the sorted one so that the committed bytes compare equal to ours.
    path = os.path.join(DIR, 'mixed.safetensors')
    for _ in range(200):
        torch_save_file(mixed, path, metadata=meta)
        with open(path, 'rb') as f:
            raw = f.read()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], 'little')])
        if list(header['__metadata__']) == sorted(meta, key=lambda k: k.encode()):
            break
    else:
        raise SystemExit('the Rust library never wrote the metadata keys sorted')

    expected = {
        'f32': describe({k: torch.from_numpy(v.copy()) for k, v in f32.items()}),
        'mixed': describe(mixed),
        'metadata': {'f32_meta': {'format': 'pt'}, 'f32_plain': None, 'mixed': meta},
        'f16_source': floats(half_src),
        'bf16_source': floats(bf16_src),
    }
    with open(os.path.join(DIR, 'expected.json'), 'w') as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write('\n')
    for name in ('f32_meta', 'f32_plain', 'mixed'):
        print(name, os.path.getsize(os.path.join(DIR, f'{name}.safetensors')), 'bytes')


if __name__ == '__main__':
    main()
