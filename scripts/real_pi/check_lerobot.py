"""Checks the reference (scripts/real_pi/reference.py) against LeRobot's own `PI0Pytorch` and
`PI05Pytorch` (src/lerobot/policies/pi0/modeling_pi0.py, pi05/modeling_pi05.py, pi_gemma.py), on
the tiny configs and the exact batches of the committed vectors (test/vectors/real-pi/): masked
camera, padded prompts, pi0.5 state bins. transformers has no pi0.5, so this is the independent
check of the pi0.5-only parts (adaRMSNorm, the time MLP, the block structure without a state token);
for pi0 it adds the masked camera and the gradients to check_transformers.py.

LeRobot is not pip-installable here; point --lerobot-src at a checkout's `src/lerobot` (e.g.
`git archive` of github.com/huggingface/lerobot). Only the modelling files run; the package's
heavy `__init__` chains, config system and policy base class are replaced by stubs. LeRobot hard-codes
the full-size SigLIP (intermediate 4304, projection 2048) and knows only gemma_2b / gemma_300m, so the
script swaps in the tiny Gemma configs and the tiny SigLIP config at construction.

Same parameters (the contract's init rule); LeRobot in float32 (its default; its code casts the
expert output to float32, so it cannot run in float64), the reference in float64 as for the vectors. Prints the largest
differences of the velocity (LeRobot: its `denoise_step` on the cached prefix), the per-datum loss
(its `forward`), every parameter's gradient of the mean loss, and the 10-step sample (its
`sample_actions`); also compares with the committed vectors. Exits 1 outside the issue's tolerances.

Run: python3 scripts/real_pi/check_lerobot.py --lerobot-src PATH/src/lerobot   (needs torch, transformers)
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from typing import TypeVar

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_vectors as V  # noqa: E402
import reference as R  # noqa: E402


def load_lerobot(src: str):
    """Imports LeRobot's pi0 and pi05 modelling modules from a source tree, with stubs for the rest."""
    def pkg(name, path=None):
        m = types.ModuleType(name)
        if path is not None:
            m.__path__ = [path]
        sys.modules[name] = m
        return m

    pkg('lerobot', src)
    pkg('lerobot.utils', os.path.join(src, 'utils'))
    iu = pkg('lerobot.utils.import_utils')
    iu._transformers_available = True
    iu.require_package = lambda *a, **k: None
    cfgs = pkg('lerobot.configs')
    cfgs.PreTrainedConfig = object
    pkg('lerobot.policies', os.path.join(src, 'policies'))
    pkg('lerobot.policies.common', os.path.join(src, 'policies', 'common'))
    pre = pkg('lerobot.policies.pretrained')
    pre.PreTrainedPolicy, pre.T = nn.Module, TypeVar('T')
    pkg('lerobot.policies.rtc')
    pkg('lerobot.policies.rtc.modeling_rtc').RTCProcessor = object
    pkg('lerobot.policies.pi05', os.path.join(src, 'policies', 'pi05'))
    c05 = pkg('lerobot.policies.pi05.configuration_pi05')
    c05.DEFAULT_IMAGE_SIZE, c05.PI05Config = 224, object
    mem = pkg('lerobot.policies.pi05.memory')
    mem.encode_video_with_mem = mem.sample_observation_history = None
    pkg('lerobot.policies.pi0', os.path.join(src, 'policies', 'pi0'))
    c0 = pkg('lerobot.policies.pi0.configuration_pi0')
    c0.DEFAULT_IMAGE_SIZE, c0.PI0Config = 224, object
    import importlib

    pg = importlib.import_module('lerobot.policies.pi_gemma')
    # LeRobot pins transformers < 5.6, whose create_causal_mask took cache_position; later
    # versions dropped the argument (the 4-D masks LeRobot passes are used as given either way).
    ccm = pg.create_causal_mask
    pg.create_causal_mask = lambda *args, cache_position=None, **kw: ccm(*args, **kw)
    return {'pi0': importlib.import_module('lerobot.policies.pi0.modeling_pi0'),
            'pi05': importlib.import_module('lerobot.policies.pi05.modeling_pi05')}


def build_lerobot(M, cfg: R.RealPiConfig):
    """PI0Pytorch / PI05Pytorch with the tiny Gemma configs and the tiny SigLIP swapped in."""
    g = lambda c: M.GemmaConfig(c.width, c.depth, c.mlpDim, c.numHeads, c.numKvHeads, c.headDim)  # noqa: E731
    M.get_gemma_config = lambda variant: {'tiny_vlm': g(cfg.vlm), 'tiny_expert': g(cfg.expert)}[variant]
    orig = M.PaliGemmaForConditionalGenerationWithPiGemma
    v = cfg.vision

    def tiny_paligemma(config):
        vc = config.vision_config
        vc.hidden_size, vc.intermediate_size, vc.num_hidden_layers = v.width, v.mlpDim, v.depth
        vc.num_attention_heads, vc.patch_size, vc.image_size = v.numHeads, v.patchSize, v.imageSize
        vc.projection_dim = cfg.vlm.width
        config.projection_dim = cfg.vlm.width
        return orig(config=config)

    M.PaliGemmaForConditionalGenerationWithPiGemma = tiny_paligemma
    conf = types.SimpleNamespace(
        paligemma_variant='tiny_vlm', action_expert_variant='tiny_expert', image_resolution=(v.imageSize, v.imageSize),
        dtype='float32', freeze_vision_encoder=False, train_expert_only=False, max_action_dim=cfg.actionDim, max_state_dim=32,
        use_proprioceptive_memory=False, compile_model=False, chunk_size=cfg.actionHorizon, num_inference_steps=cfg.numSteps,
        min_period=R.MIN_PERIOD, max_period=R.MAX_PERIOD, rtc_config=None, memory_temporal_attention_every=None,
        time_sampling_beta_alpha=1.5, time_sampling_beta_beta=1.0, time_sampling_scale=0.999, time_sampling_offset=0.001)
    return M.PI0Pytorch(conf) if cfg.variant == 'pi0' else M.PI05Pytorch(conf)


def check(M, cfg: R.RealPiConfig, vec: str) -> bool:
    lr = build_lerobot(M, cfg)
    ref = R.RealPi(cfg)
    R.init_params(ref)
    ours = {n[len('model.'):]: p for n, p in ref.named_parameters()}
    missing, unexpected = lr.load_state_dict({k: p.detach().clone() for k, p in ours.items()}, strict=False)
    heads = ['paligemma_with_expert.paligemma.lm_head.weight', 'paligemma_with_expert.gemma_expert.lm_head.weight']
    if sorted(missing) != sorted(heads) or unexpected:
        print('name mapping failed: missing', missing, 'unexpected', unexpected)
        return False
    ref = ref.double()  # LeRobot stays float32: it casts the expert output to float32 itself

    batch, _ = V.make_batch(cfg)
    f = lambda k: torch.from_numpy(batch[k]).double()  # noqa: E731
    f32 = lambda k: torch.from_numpy(batch[k]).float()  # noqa: E731
    i = lambda k: torch.from_numpy(batch[k]).long()  # noqa: E731
    images, masks = f('in/images'), torch.from_numpy(batch['in/image_masks']).bool()
    lr_images = [images[:, c].float() for c in range(3)]
    lr_masks = [masks[:, c] for c in range(3)]
    tokens, tmask = i('in/tokens'), torch.from_numpy(batch['in/token_masks']).bool()
    actions, noise, t = f('in/actions'), f('in/noise'), f('in/time')
    pi0 = cfg.variant == 'pi0'
    st = (f32('in/state'),) if pi0 else ()  # LeRobot's pi0 takes the state as an argument; pi0.5 reads it from the prompt

    # Loss and gradients: LeRobot's training forward (elementwise MSE) vs the reference's.
    lr_loss = lr.forward(lr_images, lr_masks, tokens, tmask, *st, f32('in/actions'), f32('in/noise'), f32('in/time')).mean(dim=(1, 2))
    lr_loss.mean().backward()
    ref_loss, ref_v = ref.model.loss(images, i('in/image_masks'), tokens, i('in/token_masks'), f('in/state'), actions, noise, t)
    ref_loss.mean().backward()
    # Velocity at (x_t, t): LeRobot's denoise_step on the prefix cache, as its sample_actions does.
    with torch.no_grad():
        pe, ppad, par = lr.embed_prefix(lr_images, lr_masks, tokens, tmask)
        att = M.prepare_attention_masks_4d(M.make_att_2d_masks(ppad, par))
        lr.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = 'eager'
        _, kv = lr.paligemma_with_expert.forward(attention_mask=att, position_ids=torch.cumsum(ppad, dim=1) - 1, past_key_values=None,
                                                 inputs_embeds=[pe, None], use_cache=True)
        tt = f32('in/time')[:, None, None]
        lr_v = lr.denoise_step(*st, ppad, kv, tt * f32('in/noise') + (1 - tt) * f32('in/actions'), f32('in/time')).double()
        lr_s = lr.sample_actions(lr_images, lr_masks, tokens, tmask, *st, noise=f32('in/sample_noise')).double()
        ref_s = ref.model.sample(images, i('in/image_masks'), tokens, i('in/token_masks'), f('in/state'), f('in/sample_noise'))

    vscale = ref_v.abs().max().item()
    dv = (lr_v - ref_v).abs().max().item() / vscale
    dl = ((lr_loss.double() - ref_loss).abs() / ref_loss.abs()).max().item()
    ds = (lr_s - ref_s).abs().max().item()
    lr_params = dict(lr.named_parameters())
    worst_g, worst_name, n_g = 0.0, '', 0
    for pname, p in ours.items():
        g_ref, g_lr = p.grad, lr_params[pname].grad
        g_ref = torch.zeros_like(p) if g_ref is None else g_ref
        g_lr = torch.zeros_like(g_ref) if g_lr is None else g_lr.double()
        scale = g_ref.abs().max().item()
        d = (g_lr - g_ref).abs().max().item()
        r = d / scale if scale > 1e-20 else d / 1e-2  # exact zeros: absolute, against the 1e-6 bound
        n_g += 1
        if r > worst_g:
            worst_g, worst_name = r, pname
    stored = {k: v for k, v in __import__('safetensors.numpy', fromlist=['load_file']).load_file(
        os.path.join(V.OUT_DIR, f'{vec}.safetensors')).items()}
    dv_stored = np.abs(lr_v.detach().numpy() - stored['out/velocity']).max() / np.abs(stored['out/velocity']).max()
    ds_stored = np.abs(lr_s.numpy() - stored['out/sample']).max()
    print(f'{cfg.variant}: LeRobot {type(lr).__name__} (tiny, float32, its default) vs the reference (float64), the batch of {vec}:')
    print(f'  velocity max rel. diff {dv:.3e} (max|v| {vscale:.4f}); loss max rel. diff {dl:.3e} ({lr_loss.tolist()} vs {ref_loss.tolist()})')
    print(f'  gradients: {n_g} parameters, worst max|diff|/max|g| {worst_g:.3e} ({worst_name})')
    print(f'  sample max abs diff {ds:.3e} (max|x| {ref_s.abs().max().item():.4f})')
    print(f'  LeRobot vs the committed {vec} vectors: velocity {dv_stored:.3e} relative, sample {ds_stored:.3e} absolute')
    ok = dv <= 1e-5 and dl <= 1e-5 and worst_g <= 1e-4 and ds <= 1e-4 and dv_stored <= 1e-5 and ds_stored <= 1e-4
    print('  OK' if ok else '  FAIL')
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument('--lerobot-src', required=True, help='path to a LeRobot checkout\'s src/lerobot')
    a = ap.parse_args()
    torch.set_num_threads(1)
    mods = load_lerobot(os.path.abspath(a.lerobot_src))
    ok = [check(mods[c.variant], c, n) for c, n in ((R.REAL_PI_TINY_PI0, 'tiny_pi0'), (R.REAL_PI_TINY_PI05, 'tiny_pi05'))]
    return 0 if all(ok) else 1


if __name__ == '__main__':
    sys.exit(main())
