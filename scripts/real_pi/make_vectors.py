"""Parity vectors for the TF.js real pi0 / pi0.5 (contract 3 of Vela issue 23).

Run (needs torch, numpy, safetensors; the tests do not):
    python3 scripts/real_pi/make_vectors.py
Writes test/vectors/real-pi/tiny_pi0.{safetensors,json} and tiny_pi05.{safetensors,json}.
Deterministic: a second run writes the same bytes (single thread, fixed seeds, no timestamps).

The model is the tiny config of FACTS 5.2 (horizon 10) with every parameter set by the contract's
rule (reference.init_values). The reference runs in float64 on those float32 parameter values and
float32 inputs, so the stored outputs are the rounding-free truth rounded once to float32; the
json records how far a float32 run of the same reference lands from it (`float32_noise`), the floor
any float32 implementation can expect.
"""
from __future__ import annotations

import json
import os
import sys

import re

import numpy as np
import torch
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as R  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'test', 'vectors', 'real-pi')
B = 2
TASKS = ['pick up the red cube', 'stack the green block on the blue one']
# pi0.5 state (the normalised, unpadded 8-dim state that goes into the prompt), chosen at and
# beyond the bin edges: bins -> [0, 255, -1, 255, 255, 254, 1, 128] and [-1, 255, 192, 64, 255, -1, 128, 127].
PI05_STATE_DIM = 8
PI05_STATES = [
    [-1.0, 1.0, -1.25, 1.25, 1 - 2 / 256, 0.99, -1 + 2 / 256, 0.0],
    [-1.0000001, 0.99999994, 0.5, -0.5, 2.0, -3.0, 1 / 256, -1 / 256],
]
TIMES = [0.3, 0.85]
MASKED = (0, 1)  # (datum, camera): the middle camera of datum 0, so later positions shift
MATH_ZERO_GRAD = re.compile(r'vision_tower\.encoder\.layers\.\d+\.self_attn\.k_proj\.bias$')
INIT_CHECK_NAMES = [
    R.EMBED_NAME,
    'model.paligemma_with_expert.paligemma.model.vision_tower.embeddings.patch_embedding.weight',
    'model.paligemma_with_expert.gemma_expert.model.layers.3.self_attn.q_proj.weight',
    'model.action_out_proj.bias',
]


def make_batch(cfg: R.RealPiConfig) -> dict[str, np.ndarray]:
    """The contract's batch: B = 2, one camera masked in datum 0, padded prompts."""
    rng = np.random.default_rng(20231 if cfg.variant == 'pi0' else 20232)
    s = cfg.vision.imageSize
    images = rng.uniform(-1, 1, (B, 3, 3, s, s)).astype(np.float32)
    images[MASKED] = -1.0  # a missing camera is black (FACTS 1.16)
    image_masks = np.ones((B, 3), np.int32)
    image_masks[MASKED] = 0
    state = np.zeros((B, cfg.actionDim), np.float32)
    if cfg.variant == 'pi0':
        state[:] = rng.standard_normal((B, cfg.actionDim)) * 0.5
        prompts = [R.pi0_prompt(t) for t in TASKS]
    else:
        state[:, :PI05_STATE_DIM] = np.array(PI05_STATES, np.float32)
        prompts = [R.pi05_prompt(t, state[i, :PI05_STATE_DIM]) for i, t in enumerate(TASKS)]
    toks = [R.toy_tokenize(p, cfg.maxTokenLen) for p in prompts]
    h, d = cfg.actionHorizon, cfg.actionDim
    return {
        'in/images': images,
        'in/image_masks': image_masks,
        'in/tokens': np.stack([t[0] for t in toks]),
        'in/token_masks': np.stack([t[1] for t in toks]),
        'in/state': state,
        'in/actions': rng.standard_normal((B, h, d)).astype(np.float32),
        'in/noise': rng.standard_normal((B, h, d)).astype(np.float32),
        'in/time': np.array(TIMES, np.float32),
        'in/sample_noise': rng.standard_normal((B, h, d)).astype(np.float32),
    }, prompts


def run(model: R.RealPi, batch: dict[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """Loss, velocity, gradients of mean(loss), the 10-step sample and debug tensors, in dtype."""
    model = model.to(dtype)
    model.zero_grad(set_to_none=True)
    f = lambda k: torch.from_numpy(batch[k]).to(dtype)  # noqa: E731
    i = lambda k: torch.from_numpy(batch[k])  # noqa: E731
    args = (f('in/images'), i('in/image_masks'), i('in/tokens'), i('in/token_masks'), f('in/state'))
    dbg: dict[str, torch.Tensor] = {}
    loss, v = model.model.loss(*args, f('in/actions'), f('in/noise'), f('in/time'), dbg)
    loss.mean().backward()
    sdbg: dict[str, torch.Tensor] = {}
    sample = model.model.sample(*args, f('in/sample_noise'), debug=sdbg)
    out = {'out/velocity': v, 'out/loss': loss, 'out/sample': sample}
    for k, t in dbg.items():
        out[f'dbg/{k}'] = t
    out['dbg/sample_velocity_t1'] = sdbg['sample_velocity_t1']
    for name, p in model.named_parameters():
        if name == R.EMBED_NAME:
            ids = np.unique(batch['in/tokens'])
            out['grad_rows_index'] = torch.from_numpy(ids.astype(np.int32))
            out[f'grad_rows/{name}'] = p.grad[torch.from_numpy(ids).long()]
        elif MATH_ZERO_GRAD.search(name):
            # SigLIP key bias: softmax is invariant to adding the same q.b to every logit of a row,
            # so the gradient is exactly 0 in exact arithmetic; float64 leaves ~1e-24 of noise.
            out[f'grad/{name}'] = torch.zeros_like(p)
        else:
            # None: not reached by the loss at all (left out of the graph); its gradient is 0.
            out[f'grad/{name}'] = p.grad if p.grad is not None else torch.zeros_like(p)
    res = {}
    for k, t in out.items():
        t = t.detach()
        res[k] = t.numpy().astype(np.int32) if not t.is_floating_point() or t.dtype == torch.bool else t.numpy().astype(np.float32)
    return res


def rel(a: np.ndarray, b: np.ndarray) -> float:
    s = float(np.abs(b).max())
    return float(np.abs(a.astype(np.float64) - b).max() / s) if s > 0 else float(np.abs(a).max())


def describe(cfg: R.RealPiConfig, shapes: dict[str, tuple], batch, prompts, noise32, zero_grads) -> dict:
    p, l = 3 * cfg.tokens_per_camera + cfg.maxTokenLen, cfg.maxTokenLen
    s = cfg.actionHorizon + (1 if cfg.variant == 'pi0' else 0)
    tensors = {
        'in/images': 'float32 [b, 3 cameras, 3, 56, 56], channels-first, in [-1, 1]; camera order base, left wrist, right wrist; the masked camera is all -1',
        'in/image_masks': 'int32 [b, 3]; 0 = camera missing (its tokens are invalid for attention and positions)',
        'in/tokens': f'int32 [b, {l}]: prompt ids (toy vocabulary, see prompt), right-padded with 0',
        'in/token_masks': f'int32 [b, {l}]: 1 on real tokens',
        'in/state': ('float32 [b, 32]: the normalised state, fed to state_proj' if cfg.variant == 'pi0' else
                     f'float32 [b, 32]: NOT a model input for pi0.5; its first {PI05_STATE_DIM} dims are the state discretised into the prompt (rest 0)'),
        'in/actions': 'float32 [b, ah, 32]: clean actions (t = 0 end)',
        'in/noise': 'float32 [b, ah, 32]: noise (t = 1 end) for the loss and velocity',
        'in/time': 'float32 [b]: t for the loss and velocity; x_t = t*noise + (1-t)*actions',
        'in/sample_noise': 'float32 [b, ah, 32]: x at t = 1 for the sample',
        'out/velocity': 'float32 [b, ah, 32]: v(x_t, t), x_t from in/noise, in/actions, in/time (one pass over prefix+suffix)',
        'out/loss': 'float32 [b]: mean over ah and all 32 dims of (v - (noise - actions))^2',
        'out/sample': f'float32 [b, ah, 32]: {cfg.numSteps} Euler steps, dt = -1/{cfg.numSteps}, t_k = 1 - k/{cfg.numSteps}, from in/sample_noise; prefix K/V cached',
        'grad/<name>': 'float32, the parameter\'s shape: d mean(out/loss) / d param, for every parameter but the token embedding',
        'grad_rows/' + R.EMBED_NAME: 'float32 [r, 64]: rows grad_rows_index of the token embedding\'s gradient',
        'grad_rows_index': 'int32 [r]: the distinct ids of in/tokens, ascending (pad id 0 included; its row is 0)',
        'dbg/siglip': 'float32 [b, 3, 16, 32]: SigLIP output per camera (after post_layernorm, before the projector)',
        'dbg/prefix_embs': f'float32 [b, {p}, 64]: projected image tokens (no scaling), then text embeddings * sqrt(64)',
        'dbg/suffix_embs': f'float32 [b, {s}, 32]: suffix input at (x_t, t)' + (' : state token, then action-time MLP output' if cfg.variant == 'pi0' else ': action_in_proj(x_t)'),
        'dbg/att_mask': f'int32 [b, {p + s}, {p + s}]: 1 where query row i may attend key j',
        'dbg/positions': f'int32 [b, {p + s}]: RoPE positions (cumsum of validity - 1; invalid tokens repeat their predecessor)',
        'dbg/time_emb': 'float32 [b, 32]: e(t), float64 math rounded to float32',
        'dbg/suffix_out': f'float32 [b, {s}, 32]: expert output after its final norm',
        'dbg/prefix_after_layer0': f'float32 [b, {p}, 64]: the prefix stream after the first joint layer (one pass, with the suffix)',
        'dbg/suffix_after_layer0': f'float32 [b, {s}, 32]: the suffix stream after the first joint layer',
        'dbg/sample_velocity_t1': 'float32 [b, ah, 32]: the first sampling step\'s velocity (t = 1, x = in/sample_noise), through the KV cache',
    }
    if cfg.variant == 'pi05':
        tensors['dbg/adarms_cond'] = 'float32 [b, 32]: swish(time_mlp_out(swish(time_mlp_in(e(t))))), the adaRMSNorm condition'
    init_check = {}
    for name in INIT_CHECK_NAMES:
        n = int(np.prod(shapes[name]))
        init_check[name] = {'seed': R.fnv1a32(name), 'n': n, 'first': [float(x) for x in R.init_values(name, n, 0, 8)],
                            'last': [float(x) for x in R.init_values(name, n, n - 4, 4)]}
    return {
        'about': f'Parity vectors for the real {cfg.variant} (tiny config of FACTS 5.2), made by scripts/real_pi/make_vectors.py with the PyTorch reference scripts/real_pi/reference.py in float64.',
        'config': cfg.to_json(),
        'constants': {'rmsEps': R.RMS_EPS, 'layerNormEps': R.LN_EPS, 'ropeBase': R.ROPE_BASE, 'minPeriod': R.MIN_PERIOD, 'maxPeriod': R.MAX_PERIOD,
                      'maskNeg': R.MASK_NEG, 'numCameras': 3, 'tokensPerCamera': cfg.tokens_per_camera, 'embedScale': 'sqrt(vlm.width) = 8'},
        'param_names': 'LeRobot runtime state-dict names with the policy prefix "model." (pi0_state_dict.json), no LM heads',
        'params': [[n, list(s)] for n, s in shapes.items()],
        'param_count': {'total': int(sum(np.prod(x) for x in shapes.values())),
                        'without_embedding': int(sum(np.prod(x) for n, x in shapes.items() if n != R.EMBED_NAME))},
        'init': {
            'rule': 'for parameter `name` with n elements (row-major over its PyTorch shape): seed = FNV-1a 32-bit of UTF-8(name) '
                    '(offset 2166136261, prime 16777619); u_i = i-th draw of mulberry32(seed) (state += 0x6D2B79F5; t = state; '
                    't = imul(t ^ t>>>15, t|1); t ^= t + imul(t ^ t>>>7, t|61); u = ((t ^ t>>>14)>>>0) / 2^32); value_i = fround((2*u_i - 1) * 0.05). '
                    'Every parameter, norms and biases included (so RMSNorm offsets w and adaRMS Dense are not zero).',
            'reference': 'scripts/real_pi/reference.py init_values; test/helpers/real-pi-init.ts',
        },
        'init_check': init_check,
        'tolerances': {'velocity': {'relative': 1e-5, 'meaning': 'max|got - want| <= 1e-5 * max|want|'},
                       'loss': {'relative': 1e-5},
                       'grad': {'relative_to_scale': 1e-4, 'meaning': 'per parameter, max|got - want| <= 1e-4 * max|want|; for zero_grad_params (want exactly 0) max|got| <= 1e-6'},
                       'sample': {'absolute': 1e-4}},
        'zero_grad_params': zero_grads,
        'zero_grad_note': 'exactly 0: the SigLIP k_proj biases (softmax ignores a constant added to a whole row of logits; stored as 0, float64 left ~1e-24) and, because nothing downstream uses them, the VLM\'s last-layer o_proj/MLP/post-attention norm and its '
                          'final norm (the prefix output is unused; the suffix only reads the prefix\'s keys/values), its last-layer q_proj (prefix queries only feed prefix rows)',
        'float32_noise': noise32,
        'float32_noise_note': 'how far the same reference run in float32 lands from these float64 values: the floor for a float32 implementation. '
                              'Computing e(t) in float32 instead of float64 adds ~2e-6 relative to the velocity (measured with transformers\' PI0, '
                              'which does so: scripts/real_pi/README.md), still inside the 1e-5 tolerance.',
        'prompt': {
            'strings': prompts,
            'toy_vocabulary': 'not PaliGemma: BOS = 2, then one id per ASCII character: 257024 + code point (the table\'s last 128 rows); pad 0; '
                              'truncated/padded to maxTokenLen (reference.toy_tokenize)',
            'format': ('pi0 (LeRobot): task + "\\n" (reference.pi0_prompt)' if cfg.variant == 'pi0' else
                       f'pi0.5: "Task: <task>, State: <bins>;\\nAction: " with bins = digitize(state[:{PI05_STATE_DIM}], linspace(-1, 1, 257)[:-1]) - 1 (reference.pi05_prompt, discretize_state)'),
            **({'state_bins': [[int(b) for b in R.discretize_state(np.array(st, np.float32))] for st in PI05_STATES]} if cfg.variant == 'pi05' else {}),
        },
        'batch': {'b': B, 'masked_camera': {'datum': MASKED[0], 'camera': MASKED[1]}, 'valid_prompt_tokens': [int(x) for x in batch['in/token_masks'].sum(1)],
                  'prefix_tokens': p, 'suffix_tokens': s},
        'choices': 'see the comment block at the top of scripts/real_pi/reference.py (C1-C10)',
        'tensors': tensors,
    }


def build(cfg: R.RealPiConfig, name: str) -> None:
    model = R.RealPi(cfg)
    R.init_params(model)
    batch, prompts = make_batch(cfg)
    res = run(model, batch, torch.float64)
    res32 = run(model, batch, torch.float32)
    noise32 = {'velocity_rel': rel(res32['out/velocity'], res['out/velocity']), 'loss_rel': rel(res32['out/loss'], res['out/loss']),
               'sample_abs': float(np.abs(res32['out/sample'].astype(np.float64) - res['out/sample']).max()),
               'grad_rel_worst': max(rel(res32[k], res[k]) for k in res if k.startswith('grad/') and np.abs(res[k]).max() > 0),
               'grad_abs_worst_on_zero_grads': max(float(np.abs(res32[k]).max()) for k in res if k.startswith('grad/') and not np.any(res[k]))}
    zero_grads = sorted(k[len('grad/'):] for k in res if k.startswith('grad/') and not np.any(res[k]))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    meta = describe(cfg, shapes, batch, prompts, noise32, zero_grads)
    tensors = {**batch, **res}
    os.makedirs(OUT_DIR, exist_ok=True)
    st_path = os.path.join(OUT_DIR, f'{name}.safetensors')
    tmp = st_path + '.tmp'
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(tensors.items())}, tmp)
    os.replace(tmp, st_path)
    js_path = os.path.join(OUT_DIR, f'{name}.json')
    with open(js_path + '.tmp', 'w') as f:
        json.dump(meta, f, indent=1)
        f.write('\n')
    os.replace(js_path + '.tmp', js_path)
    print(f'{name}: {os.path.getsize(st_path):,} bytes; loss {res["out/loss"].tolist()}; max|v| {np.abs(res["out/velocity"]).max():.4f}; '
          f'float32 noise {json.dumps(noise32)}; zero grads {len(zero_grads)}')


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    build(R.REAL_PI_TINY_PI0, 'tiny_pi0')
    build(R.REAL_PI_TINY_PI05, 'tiny_pi05')


if __name__ == '__main__':
    main()
