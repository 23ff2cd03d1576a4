"""Checks the reference (scripts/real_pi/reference.py) once against an independent port:
transformers' `PI0ForConditionalGeneration` (transformers >= 5.x with models/pi0; FACTS 5.3), on the
tiny pi0 config with all cameras present (that port drops missing cameras instead of masking them).

Both models get the same parameters (the contract's init rule, mapped to transformers' names), the
batch of make_vectors.py with every camera present, and run in float32. Prints the largest
differences of the velocity at a fixed (noise, t), the per-datum loss, and the 10-step sample from
fixed noise; exits 1 when the velocity differs by more than 1e-5 relative or the sample by more
than 1e-4.

Run: python3 scripts/real_pi/check_transformers.py   (needs torch, numpy, transformers with PI0)
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_vectors as V  # noqa: E402
import reference as R  # noqa: E402

import transformers  # noqa: E402
from transformers import PI0Config, PI0ForConditionalGeneration  # noqa: E402

IMAGE_TOKEN = 257152


def hf_config(cfg: R.RealPiConfig, attn: str) -> PI0Config:
    gemma = lambda c: {'model_type': 'gemma', 'hidden_size': c.width, 'intermediate_size': c.mlpDim,  # noqa: E731
                       'num_hidden_layers': c.depth, 'num_attention_heads': c.numHeads, 'num_key_value_heads': c.numKvHeads,
                       'head_dim': c.headDim, 'vocab_size': 257152, 'hidden_act': 'gelu_pytorch_tanh', 'rms_norm_eps': R.RMS_EPS}
    v = cfg.vision
    conf = PI0Config(
        vlm_config={'model_type': 'paligemma', 'text_config': gemma(cfg.vlm),
                    'vision_config': {'model_type': 'siglip_vision_model', 'hidden_size': v.width, 'intermediate_size': v.mlpDim,
                                      'num_hidden_layers': v.depth, 'num_attention_heads': v.numHeads, 'patch_size': v.patchSize,
                                      'image_size': v.imageSize, 'vision_use_head': False, 'hidden_act': 'gelu_pytorch_tanh',
                                      'layer_norm_eps': R.LN_EPS},
                    'projection_dim': cfg.vlm.width, 'image_token_id': IMAGE_TOKEN},
        dit_config=gemma(cfg.expert), chunk_size=cfg.actionHorizon, max_state_dim=32, max_action_dim=cfg.actionDim,
        num_inference_steps=cfg.numSteps, loss_reduction='none')
    conf._attn_implementation = attn
    return conf


def hf_name(ours: str) -> str:
    """Reference (LeRobot) name -> transformers-native PI0 name (the renaming of FACTS 2.2)."""
    n = ours[len('model.'):]
    for a, b in (('paligemma_with_expert.paligemma.model.', 'model.vlm.'), ('paligemma_with_expert.gemma_expert.model.', 'model.dit.')):
        if n.startswith(a):
            return b + n[len(a):]
    if n.split('.')[0] in ('state_proj', 'action_in_proj', 'action_time_mlp_in', 'action_time_mlp_out'):
        return 'embed_action_time.' + n
    return n


def compare(cfg, ref, batch, input_ids, attention_mask, pix_mask, label) -> float:
    """Runs both models on one batch; prints the differences; returns the worst ratio to the bounds."""
    f = lambda k: torch.from_numpy(batch[k]).float()  # noqa: E731
    i = lambda k: torch.from_numpy(batch[k]).long()  # noqa: E731
    worst = 0.0
    with torch.no_grad():
        ref_loss, ref_v = ref.model.loss(f('in/images'), i('in/image_masks'), i('in/tokens'), i('in/token_masks'), f('in/state'),
                                         f('in/actions'), f('in/noise'), f('in/time'))
        ref_s = ref.model.sample(f('in/images'), i('in/image_masks'), i('in/tokens'), i('in/token_masks'), f('in/state'), f('in/sample_noise'))
        ref64 = R.RealPi(cfg)
        R.init_params(ref64)
        ref64 = ref64.double()
        _, ref_v64 = ref64.model.loss(f('in/images').double(), i('in/image_masks'), i('in/tokens'), i('in/token_masks'), f('in/state').double(),
                                      f('in/actions').double(), f('in/noise').double(), f('in/time').double())

    for attn in ('eager', 'sdpa'):
        hf = PI0ForConditionalGeneration(hf_config(cfg, attn)).eval()
        sd = hf.state_dict()
        mapped = {hf_name(n): p.detach().clone() for n, p in ref.named_parameters()}
        unexpected = sorted(set(mapped) - set(sd))
        missing = sorted(set(sd) - set(mapped))
        bad = [n for n in mapped if n in sd and tuple(sd[n].shape) != tuple(mapped[n].shape)]
        if unexpected or bad or missing != ['model.dit.embed_tokens.weight']:
            print('name mapping failed:', unexpected, bad, missing)
            return float('inf')
        hf.load_state_dict(mapped, strict=False)  # model.dit.embed_tokens: the expert's unused embedding
        with torch.no_grad():
            out = hf(state=f('in/state'), noise=f('in/noise'), timestep=f('in/time'), input_ids=input_ids, pixel_values=f('in/images'),
                     pixel_attention_mask=pix_mask, attention_mask=attention_mask, actions=f('in/actions'))
            hf_v, hf_loss = out.logits, out.loss.mean(dim=(1, 2))
            hf_s = hf.sample_actions(state=f('in/state'), input_ids=input_ids, pixel_values=f('in/images'), noise=f('in/sample_noise'),
                                     attention_mask=attention_mask, pixel_attention_mask=pix_mask)
        dv = (hf_v - ref_v).abs().max().item()
        scale = ref_v.abs().max().item()
        dl = ((hf_loss - ref_loss).abs() / ref_loss.abs()).max().item()
        ds = (hf_s - ref_s).abs().max().item()
        d64 = (hf_v.double() - ref_v64).abs().max().item()
        print(f'{label} [{attn}] velocity: max|diff| {dv:.3e} (max|v| {scale:.4f}, relative {dv / scale:.3e}); float64 reference vs transformers {d64 / scale:.3e} relative; '
              f'loss: max relative diff {dl:.3e} ({ref_loss.tolist()} vs {hf_loss.tolist()}); sample: max|diff| {ds:.3e} (max|x| {ref_s.abs().max().item():.4f})')
        worst = max(worst, dv / scale / 1e-5, ds / 1e-4)
    return worst


def main() -> int:
    torch.manual_seed(0)
    cfg = R.REAL_PI_TINY_PI0
    ref = R.RealPi(cfg)
    R.init_params(ref)
    batch, _ = V.make_batch(cfg)
    rng = np.random.default_rng(7)
    batch['in/images'][V.MASKED] = rng.uniform(-1, 1, batch['in/images'][V.MASKED].shape)  # every camera present
    batch['in/image_masks'][:] = 1
    f = lambda k: torch.from_numpy(batch[k]).float()  # noqa: E731
    i = lambda k: torch.from_numpy(batch[k]).long()  # noqa: E731
    b = batch['in/tokens'].shape[0]
    n_img = 3 * cfg.tokens_per_camera
    input_ids = torch.cat([torch.full((b, n_img), IMAGE_TOKEN), i('in/tokens')], dim=1)
    attention_mask = torch.cat([torch.ones(b, n_img, dtype=torch.long), i('in/token_masks')], dim=1)
    pix_mask = torch.ones(b, 3, dtype=torch.bool)

    worst = 0.0
    print(f'transformers {transformers.__version__}, torch {torch.__version__}, float32, tiny pi0, B={b}')
    worst = max(worst, compare(cfg, ref, batch, input_ids, attention_mask, pix_mask, 'all cameras present'))
    # The masked-camera batch of the vectors: transformers drops the missing camera (its 16
    # placeholders leave datum 0's prompt; the row is right-padded), the reference masks it.
    batch, _ = V.make_batch(cfg)
    keep = torch.from_numpy(batch['in/image_masks']).bool()
    rows, masks = [], []
    for d in range(b):
        ids = [IMAGE_TOKEN] * (int(keep[d].sum()) * cfg.tokens_per_camera) + batch['in/tokens'][d].tolist()
        m = [1] * (len(ids) - cfg.maxTokenLen) + batch['in/token_masks'][d].tolist()
        rows.append(ids + [0] * (input_ids.shape[1] - len(ids)))
        masks.append(m + [0] * (input_ids.shape[1] - len(m)))
    worst = max(worst, compare(cfg, ref, batch, torch.tensor(rows), torch.tensor(masks), keep, 'datum 0 camera 1 missing (transformers drops it)'))
    print('OK' if worst <= 1 else 'FAIL: outside 1e-5 relative (velocity) / 1e-4 (sample)')
    return 0 if worst <= 1 else 1


if __name__ == '__main__':
    sys.exit(main())
