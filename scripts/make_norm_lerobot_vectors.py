"""Reference vectors for kernels/normalize.ts normalizerOf(mode, 'lerobot'): LeRobot's arithmetic
(lerobot/processor/normalize_processor.py _NormalizationMixin._apply_transform at 7427f3180), in
numpy float64 on the data and stats of test/vectors/normalize/norm.json, cast to float32 once.

  MEAN_STD   normalise (x - mean) / (std + eps)      unnormalise x * std + mean
  QUANTILES  normalise 2 (x - q01) / d - 1           unnormalise (x + 1) d / 2 + q01
             with d = q99 - q01, or eps where q99 == q01; eps = 1e-8 (the step's default)

The unnormalised rows are of the float32 normalised rows (what a model would emit). The openpi
forms of the same rows are in norm.json; here also their difference, which is what the convention
changes. Column 3 of the data is constant (std 0, q01 == q99): the eps branch.

Run: python3 scripts/make_norm_lerobot_vectors.py  (needs numpy; the tests do not.)
Writes test/vectors/normalize/lerobot.json.
"""
import json
import os

import numpy as np

HERE = os.path.join(os.path.dirname(__file__), '..', 'test', 'vectors', 'normalize')
EPS = 1e-8


def main():
    with open(os.path.join(HERE, 'norm.json')) as f:
        ref = json.load(f)
    d, rows = ref['d'], ref['rows']
    x = np.asarray(ref['data'], dtype=np.float32).reshape(-1, d)[:rows].astype(np.float64)
    s = {k: np.asarray(v, dtype=np.float64) for k, v in ref['stats'].items()}
    z = ((x - s['mean']) / (s['std'] + EPS)).astype(np.float32)
    unz = (z.astype(np.float64) * s['std'] + s['mean']).astype(np.float32)
    rng = s['q99'] - s['q01']
    rng = np.where(rng == 0, EPS, rng)
    q = (2 * (x - s['q01']) / rng - 1).astype(np.float32)
    unq = ((q.astype(np.float64) + 1) * rng / 2 + s['q01']).astype(np.float32)
    flat = lambda a: [float(v) for v in a.reshape(-1)]
    out = {
        'eps': EPS, 'rows': rows, 'd': d,
        'zscore': flat(z), 'unzscore': flat(unz), 'quantile': flat(q), 'unquantile': flat(unq),
        'generator': f'numpy {np.__version__}',
    }
    with open(os.path.join(HERE, 'lerobot.json'), 'w') as f:
        json.dump(out, f)
        f.write('\n')
    openpi_z = np.asarray(ref['zscore'], dtype=np.float32).reshape(-1, d)
    print('max |lerobot z - openpi z| per column', np.abs(z - openpi_z).max(axis=0))


if __name__ == '__main__':
    main()
