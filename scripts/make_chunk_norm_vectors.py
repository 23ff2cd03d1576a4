"""Reference vector for delta-action norm stats over action-chunk entries (issue 16, item 1).

Run: python3 scripts/make_chunk_norm_vectors.py  (needs numpy; the tests do not.)
Writes test/vectors/chunk_norm/chunk_norm.json: three small episodes (state [l, 3], action [l, 4],
float32), delta pairs (action dim, state dim), a horizon, and what numpy computes directly:
the chunk entries action[t + k] - state[t] on paired dims for k < horizon and t + k < l (padding
excluded, openpi's "transform first, then statistics"), their count, and np.mean, np.std (ddof 0),
np.quantile 0.01 / 0.99 (default 'linear') of those entries in float64; plus the per-frame
(horizon 1) stats for contrast, which must differ.
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), '..', 'test', 'vectors', 'chunk_norm', 'chunk_norm.json')


def chunk_entries(episodes, horizon, pairs):
    rows = []
    for ep in episodes:
        state, action = ep['state'], ep['action']
        n = len(state)
        for t in range(n):
            for k in range(horizon):
                if t + k >= n:
                    break  # padding: the loss masks it, so the stats leave it out
                row = action[t + k].copy()
                for a, s in pairs:
                    row[a] = np.float32(row[a] - state[t, s])  # float32 arithmetic, as the data is stored
                rows.append(row)
    return np.stack(rows).astype(np.float32)


def stats(x):
    x = x.astype(np.float64)
    return {'mean': x.mean(0).tolist(), 'std': x.std(0).tolist(),
            'q01': np.quantile(x, 0.01, axis=0).tolist(), 'q99': np.quantile(x, 0.99, axis=0).tolist()}


def main():
    rng = np.random.default_rng(16)
    episodes = []
    for length in (11, 3, 7):
        # A smooth trajectory so that actions lead the state, as a robot's do: delta spread grows with k.
        state = np.cumsum(rng.standard_normal((length, 3)) * 0.3, axis=0).astype(np.float32)
        action = np.concatenate([state[1:], state[-1:]], 0)[:, [0, 1, 2, 0]].astype(np.float32)
        action[:, 3] = rng.uniform(-1, 1, length).astype(np.float32)  # a dim the state does not share
        action[:, 2] += 0.5
        episodes.append({'state': state, 'action': action})
    pairs = [(0, 0), (1, 1), (2, 2)]
    horizon = 4
    rows = chunk_entries(episodes, horizon, pairs)
    out = {
        'state_dim': 3, 'action_dim': 4, 'horizon': horizon, 'pairs': pairs,
        'episodes': [{'length': len(e['state']), 'state': [float(v) for v in e['state'].reshape(-1)],
                      'action': [float(v) for v in e['action'].reshape(-1)]} for e in episodes],
        'count': int(rows.shape[0]),
        'first_rows': [float(v) for v in rows[:6].reshape(-1)],
        'stats': stats(rows),
        'per_frame_stats': stats(chunk_entries(episodes, 1, pairs)),
        'generator': f'numpy {np.__version__}',
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, 'w') as f:
        json.dump(out, f, indent=1)
        f.write('\n')
    print(f'wrote {OUT}: {rows.shape[0]} chunk entries')


if __name__ == '__main__':
    main()
