"""Reference vectors for kernels/normalize.ts, computed with numpy (float64).

Run: python3 scripts/make_norm_vectors.py  (needs numpy; the tests do not.)
Writes test/vectors/normalize/norm.json: float32 data [N, D] (N chosen so that (N - 1) * q is not
an integer and numpy's interpolation is exercised on both sides of 0.5), its stats as numpy computes
them from the float64 copy (np.mean, np.std ddof 0, np.quantile 0.01 / 0.99 default 'linear'),
z-score and quantile transforms of the first rows (float64 math cast to float32, as MODEL.md
writes them), and openpi-style delta actions.
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), '..', 'test', 'vectors', 'normalize', 'norm.json')


def main():
    rng = np.random.default_rng(7)
    n, d = 237, 5
    data = np.stack([
        rng.standard_normal(n) * 3 + 1,
        rng.uniform(-0.5, 0.25, n),
        np.round(rng.standard_normal(n), 1),  # many ties
        np.full(n, 0.125),  # constant: std 0, q01 == q99
        rng.exponential(2.0, n) - 1,  # skewed
    ], axis=1).astype(np.float32)
    x = data.astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    q01, q99 = np.quantile(x, 0.01, axis=0), np.quantile(x, 0.99, axis=0)
    rows = x[:6]
    z = ((rows - mean) / (std + 1e-6)).astype(np.float32)
    qn = ((rows - q01) / (q99 - q01 + 1e-6) * 2 - 1).astype(np.float32)
    # Delta actions: horizon 3, action dim 4, state dim 5, mask on dims 0, 1, 3 (openpi DeltaActions).
    actions = data[6:9, :4]
    state = data[9]
    mask = [True, True, False, True]
    delta = actions.copy()
    delta[..., :len(mask)] -= np.where(mask, state[:len(mask)], 0)
    out = {
        'n': n, 'd': d,
        'data': [float(v) for v in data.reshape(-1)],
        'stats': {'mean': mean.tolist(), 'std': std.tolist(), 'q01': q01.tolist(), 'q99': q99.tolist()},
        'rows': 6,
        'zscore': [float(v) for v in z.reshape(-1)],
        'quantile': [float(v) for v in qn.reshape(-1)],
        'delta': {'actions': [float(v) for v in actions.reshape(-1)], 'action_dim': 4,
                  'state': [float(v) for v in state], 'mask': mask,
                  'expected': [float(v) for v in delta.astype(np.float32).reshape(-1)]},
        'generator': f'numpy {np.__version__}',
    }
    with open(OUT, 'w') as f:
        json.dump(out, f)
        f.write('\n')
    print('q01', q01, 'q99', q99, 'virtual index', (n - 1) * 0.01, (n - 1) * 0.99)


if __name__ == '__main__':
    main()
