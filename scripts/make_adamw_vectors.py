"""Reference vectors for kernels/optim.ts, made with torch.optim.AdamW (CPU, float32).

Run: python3 scripts/make_adamw_vectors.py  (needs torch and numpy; the tests do not.)
Writes test/vectors/adamw/adamw.json: for each case the options, the starting parameters, the
gradients of each of three steps, and after each step the pre-clip global L2 norm and the
parameters; after the last step also torch's exp_avg / exp_avg_sq and step.

Clipping follows PROTOCOL.md section 3 (scale by clip / norm when norm > clip), not
torch.nn.utils.clip_grad_norm_ (which divides by norm + 1e-6): the norm is taken in float64 over
the float32 gradients and the gradients are scaled in float32 before optimizer.step().
"""
import json
import math
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(__file__), '..', 'test', 'vectors', 'adamw', 'adamw.json')
SHAPES = {'layer.weight': [3, 4], 'layer.bias': [4], 'head.scale': [2, 1, 3]}

CASES = [
    # Every option away from its default; no clipping; torch's lerp branch for weight < 0.5.
    dict(name='decay', learning_rate=1e-2, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.1,
         grad_clip_norm=0.0, grad_scales=[1.0, 0.5, 2.0]),
    # Clipping active at steps 1 and 3 but not 2; beta1 = 0.3 takes torch's lerp branch for
    # weight >= 0.5.
    dict(name='clipped', learning_rate=5e-3, beta1=0.3, beta2=0.9, eps=1e-6, weight_decay=0.01,
         grad_clip_norm=0.5, grad_scales=[1.0, 0.05, 3.0]),
    # PROTOCOL.md defaults.
    dict(name='defaults', learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0,
         grad_clip_norm=0.0, grad_scales=[1.0, 1.0, 1.0]),
]


def f32_list(t):
    return [float(x) for x in np.asarray(t, dtype=np.float32).reshape(-1)]


def run_case(case, rng):
    params0 = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: (rng.standard_normal(s) * scale * 0.3).astype(np.float32) for k, s in SHAPES.items()}
             for scale in case['grad_scales']]
    tparams = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params0.items()}
    opt = torch.optim.AdamW(list(tparams.values()), lr=case['learning_rate'],
                            betas=(case['beta1'], case['beta2']), eps=case['eps'],
                            weight_decay=case['weight_decay'], foreach=False, fused=False)
    steps = []
    for g in grads:
        norm = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in g.values()))
        clip = case['grad_clip_norm']
        for k, p in tparams.items():
            p.grad = torch.from_numpy(g[k].copy())
            if clip > 0 and norm > clip:
                p.grad.mul_(clip / norm)
        opt.step()
        steps.append({
            'grads': {k: f32_list(v) for k, v in g.items()},
            'grad_norm': norm,
            'clipped': bool(clip > 0 and norm > clip),
            'params_after': {k: f32_list(p.detach()) for k, p in tparams.items()},
        })
    state = {}
    for k, p in tparams.items():
        st = opt.state[p]
        state[f'{k}.exp_avg'] = f32_list(st['exp_avg'])
        state[f'{k}.exp_avg_sq'] = f32_list(st['exp_avg_sq'])
        step = int(st['step'].item())
    return {
        'name': case['name'],
        'options': {k: case[k] for k in ('learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm')},
        'shapes': SHAPES,
        'params': {k: f32_list(v) for k, v in params0.items()},
        'steps': steps,
        'final_state': {'step': step, 'tensors': state},
    }


def main():
    rng = np.random.default_rng(20261130)
    out = {'generator': f'torch {torch.__version__} torch.optim.AdamW(foreach=False), numpy {np.__version__}',
           'cases': [run_case(c, rng) for c in CASES]}
    with open(OUT, 'w') as f:
        json.dump(out, f, indent=1)
        f.write('\n')
    for c in out['cases']:
        print(c['name'], [round(s['grad_norm'], 4) for s in c['steps']], [s['clipped'] for s in c['steps']])


if __name__ == '__main__':
    main()
