"""LeRobot end to end, for Vela issue 32 ("Equal to LeRobot, end to end"): runs tiny pi0 and tiny
pi0.5 through LeRobot's OWN code, from raw robot-unit inputs to robot-unit actions, and writes

* test/fixtures/real-pi/lerobot_tiny_pi0/ and lerobot_tiny_pi05/: checkpoint folders laid out as
  LeRobot's `PI0Policy.save_pretrained` + `PolicyProcessorPipeline.save_pretrained` write them
  (config.json, model.safetensors with the policy's own state-dict names, policy_preprocessor.json
  + its normalizer state file, policy_postprocessor.json + its unnormalizer state file, and the
  tokenizer step's `tokenizer/` artifact folder);
* test/vectors/real-pi/lerobot_e2e.json: the inputs and what LeRobot computes from them.

What runs is LeRobot's: `make_pi0_pre_post_processors` / `make_pi05_pre_post_processors` (rename,
batch, Pi0NewLineProcessor / Pi05PrepareStateTokenizerProcessorStep, TokenizerProcessorStep,
device, NormalizerProcessorStep; UnnormalizerProcessorStep after), `PI0Policy` / `PI05Policy`
(`_preprocess_images`, `prepare_state`, `forward`, `predict_action_chunk`), `PI0Pytorch.denoise_step`,
the processor pipeline's `save_pretrained` (the real one: HubMixin -> `_save_pretrained`, step
state files, the tokenizer's `save_artifacts`), the config's `_save_pretrained` and
huggingface_hub's `save_torch_state_dict` (what `PreTrainedPolicy._save_pretrained` calls).
What is stubbed (LeRobot is not pip-installable here; its source tree is imported): `draccus`
(not in the local index: scripts/real_pi/stubs/draccus, whose `encode` mirrors draccus' for the
dataclass / enum / Path / tuple values a policy config holds), the policy base class
(`PreTrainedPolicy` -> nn.Module; its `_save_pretrained` is the two calls above, mirrored),
the RTC processor and pi0.5 memory modules (unused), the hub download of
`google/paligemma-3b-pt-224` (-> the committed test tokenizer, test/vectors/real-pi/tokenizer),
and the hard-coded sizes (tiny Gemma / SigLIP as check_lerobot.py, plus the vocabulary: the test
tokenizer's 1,011 ids instead of 257,152, so a folder stays ~1.5 MB).

Noise and flow times are drawn with Vela's generator (kernels/rng.ts, ported below as `VelaRng`)
so a session's first `forward` and `forward_backward`, a seeded `sample` and `vela policy
--seed` get the same inputs as LeRobot got here; the generator only makes inputs, it takes no
part in what is compared.

Run: .scratch/venv/bin/python scripts/real_pi/make_lerobot_e2e.py --lerobot-src .scratch/lerobot/src/lerobot
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import types
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..'))
sys.path.insert(0, HERE)
import reference as R  # noqa: E402

TOKENIZER_DIR = os.path.join(ROOT, 'test', 'vectors', 'real-pi', 'tokenizer')
FIXTURES = os.path.join(ROOT, 'test', 'fixtures', 'real-pi')
OUT_JSON = os.path.join(ROOT, 'test', 'vectors', 'real-pi', 'lerobot_e2e.json')
STUBS = os.path.join(HERE, 'stubs')  # draccus stand-in
TEST_VOCAB = 1011  # the test tokenizer: 1000 pieces + 11 added tokens (test/helpers/real-pi-base.ts)

B, S_DIM, A_DIM = 2, 6, 6  # the robot's native state / action dims (the model pads to 32)
CAMERAS = ['observation.images.base_0_rgb', 'observation.images.left_wrist_0_rgb', 'observation.images.right_wrist_0_rgb']
CAMERA_NAMES = ['base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb']
TASKS = ['pick up the red block\n', '  stack_the  green_cup on top ']
SESSION_SEED, SAMPLE_SEED, POLICY_SEED = 0, 11, 5
VELOCITY_TIMES = [0.3, 0.85]

# Statistics in robot units (radians / metres): std ~0.08 and a narrow quantile range, so the
# transform's epsilon (LeRobot: (x - mean) / (std + 1e-8); quantiles without one) shows at 1e-7.
STATE_MEAN = [0.12, -0.45, 0.8, 0.03, -1.1, 0.5]
STATE_STD = [0.08, 0.21, 0.05, 0.33, 0.12, 0.018]
STATE_Q01 = [-0.07, -0.93, 0.69, -0.71, -1.38, 0.46]
STATE_Q99 = [0.31, 0.04, 0.92, 0.79, -0.83, 0.54]
ACTION_MEAN = [0.1, -0.4, 0.75, 0.0, -1.05, 0.48]
ACTION_STD = [0.09, 0.2, 0.06, 0.3, 0.11, 0.02]
ACTION_Q01 = [-0.1, -0.9, 0.6, -0.7, -1.3, 0.43]
ACTION_Q99 = [0.3, 0.1, 0.9, 0.7, -0.8, 0.53]


def f32(x):
    return np.asarray(x, dtype=np.float32)


def raw_state(variant: str) -> np.ndarray:
    """[B, 6] robot-unit state. pi0.5 (QUANTILES): chosen so the normalised value, 2(x-q01)/(q99-q01)-1,
    lands exactly on -1 and 1 (x = q01, q99), beyond them (bins -1 and 255), and a third of a
    bin inside the edges 1 - 2/256, -1 + 2/256 and 0 (so float32 rounding cannot move a bin)."""
    q01, q99 = f32(STATE_Q01).astype(np.float64), f32(STATE_Q99).astype(np.float64)
    d = q99 - q01
    to_raw = lambda n: q01 + (np.asarray(n) + 1) / 2 * d  # noqa: E731
    w = 2 / 256
    n0 = [-1.0, 1.0, -1.3, 1.3, 1 - w + w / 3, -1 + w - w / 3]
    n1 = [w / 3, -w / 3, 0.5 + w / 3, -0.5 - w / 3, 1 - w - w / 3, -1 + w + w / 3]
    s = np.stack([to_raw(n0), to_raw(n1)]).astype(np.float32)
    s[0, 0], s[0, 1] = f32(STATE_Q01)[0], f32(STATE_Q99)[1]  # exactly the quantiles
    return s


def raw_images() -> np.ndarray:
    """[B, 3 cameras, 56, 56, 3] uint8: a fixed pattern (the TS test rebuilds it): value
    (b * 37 + c * 71 + y * 5 + x * 3 + ch * 101) mod 256."""
    b, c, y, x, ch = np.meshgrid(np.arange(B), np.arange(3), np.arange(56), np.arange(56), np.arange(3), indexing='ij')
    return ((b * 37 + c * 71 + y * 5 + x * 3 + ch * 101) % 256).astype(np.uint8)


def raw_actions() -> np.ndarray:
    """[B, 10, 6] robot-unit actions: the action mean plus a smooth offset of ~1 std."""
    h = np.arange(10)[None, :, None]
    a = np.arange(A_DIM)[None, None, :]
    b = np.arange(B)[:, None, None]
    z = np.sin(0.7 * h + 1.3 * a + 2.1 * b)
    return (f32(ACTION_MEAN)[None, None, :] + z * f32(ACTION_STD)[None, None, :]).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Vela's generator (kernels/rng.ts), to draw the same noise and times as a session does.

M32 = 0xFFFFFFFF


def _splitmix32(seed):
    s = [seed & M32]

    def nxt():
        s[0] = (s[0] + 0x9E3779B9) & M32
        z = s[0]
        z = ((z ^ (z >> 16)) * 0x85EBCA6B) & M32
        z = ((z ^ (z >> 13)) * 0xC2B2AE35) & M32
        return (z ^ (z >> 16)) & M32
    return nxt


def _rotl(x, k):
    return ((x << k) | (x >> (32 - k))) & M32


class VelaRng:
    """xoshiro128** seeded through splitmix32, uniforms of 24 bits, Box-Muller normals (kernels/rng.ts)."""

    def __init__(self, seed: int):
        hi = (abs(seed) // 2**32) & M32
        sm = _splitmix32((seed & M32) ^ ((hi * 0x27D4EB2D) & M32))
        self.s = [sm(), sm(), sm(), sm()]
        if all(x == 0 for x in self.s):
            self.s[0] = 1

    def next_u32(self):
        s = self.s
        result = (_rotl((s[1] * 5) & M32, 7) * 9) & M32
        t = (s[1] << 9) & M32
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 11)
        return result

    def uniform(self):
        return (self.next_u32() >> 8) / 16777216

    def uniforms(self, n):
        return f32([self.uniform() for _ in range(n)])

    def normals(self, n):
        out = np.zeros(n, np.float32)
        for i in range(0, n, 2):
            u1 = 1 - self.uniform()
            u2 = self.uniform()
            r = math.sqrt(-2 * math.log(u1))
            out[i] = r * math.cos(2 * math.pi * u2)
            if i + 1 < n:
                out[i + 1] = r * math.sin(2 * math.pi * u2)
        return out


def draw_noise_time(rng: VelaRng, b: int, h: int, a: int):
    """kernels/flow.ts drawNoiseTime with Beta(1.5, 1) times: noise [b, h, a], then time [b]."""
    noise = rng.normals(b * h * a).reshape(b, h, a)
    u = rng.uniforms(b).astype(np.float64)
    return noise, f32(0.999 * np.power(u, 2 / 3) + 0.001)


def policy_seed(seed: int, stream: int, n: int) -> int:
    """server/policy/seeds.ts: u32 LE of the first 4 bytes of SHA-256("vela-policy-seed:S:K:n")."""
    return int.from_bytes(hashlib.sha256(f'vela-policy-seed:{seed}:{stream}:{n}'.encode()).digest()[:4], 'little')


# ----------------------------------------------------------------------------------------------
# LeRobot from its source tree.

# LeRobot needs Python >= 3.12 (PEP 695 generics in two modules); torch here is for 3.11, so those
# two lines are rewritten to the equivalent typing.Generic form as the modules load.
PEP695 = {
    'lerobot.processor.pipeline': [('class DataProcessorPipeline[TInput, TOutput](HubMixin):',
                                    'class DataProcessorPipeline(HubMixin, Generic[TInput, TOutput]):'),
                                   ('from typing import Any,', 'from typing import Generic, Any,')],
    'lerobot.utils.io_utils': [('def deserialize_json_into_object[T: JsonLike](fpath: Path, obj: T) -> T:',
                                'def deserialize_json_into_object(fpath: Path, obj):')],
}


class _Pep695Finder:
    """A meta-path finder that loads the PEP695 modules from their rewritten source."""

    def find_spec(self, name, path, target=None):
        if name not in PEP695:
            return None
        import importlib.machinery
        import importlib.util
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        src_path = spec.origin

        class Loader(importlib.machinery.SourceFileLoader):
            def get_data(self, p):
                text = open(p, encoding='utf-8').read()
                for old, new in PEP695[name]:
                    assert old in text, (name, old)
                    text = text.replace(old, new, 1)
                return text.encode()

            def get_code(self, fullname):
                return compile(self.get_data(src_path), src_path, 'exec', dont_inherit=True)
        return importlib.util.spec_from_file_location(name, src_path, loader=Loader(name, src_path))


def load_lerobot(src: str, cfg_by_variant):
    """Imports LeRobot's configs, processor steps, pi0 / pi0.5 processors and policies."""
    sys.path.insert(0, STUBS)  # draccus
    sys.path.insert(0, os.path.dirname(src))
    sys.meta_path.insert(0, _Pep695Finder())
    import importlib

    def pkg(name, path=None):
        m = types.ModuleType(name)
        if path is not None:
            m.__path__ = [path]
        sys.modules[name] = m
        return m

    pkg('lerobot', src)
    pkg('lerobot.utils', os.path.join(src, 'utils'))
    iu = importlib.import_module('lerobot.utils.import_utils')
    iu.require_package = lambda *a, **k: None
    # configs: its __init__ pulls in datasets / video (torchvision); take the two modules we need.
    cfgs = pkg('lerobot.configs', os.path.join(src, 'configs'))
    ty = importlib.import_module('lerobot.configs.types')
    for k in ('FeatureType', 'NormalizationMode', 'PipelineFeatureType', 'PolicyFeature', 'RTCAttentionSchedule'):
        setattr(cfgs, k, getattr(ty, k))
    pol = importlib.import_module('lerobot.configs.policies')
    cfgs.PreTrainedConfig = pol.PreTrainedConfig
    # processor: its __init__ imports env / HIL steps we do not need; import the policy ones.
    proc = pkg('lerobot.processor', os.path.join(src, 'processor'))
    import transformers
    tok_orig = transformers.AutoTokenizer.from_pretrained
    hub_tok = 'google/paligemma-3b-pt-224'
    def paligemma_kind(name, *a, **k):
        """The test tokenizer in place of the gated hub one, with PaliGemma's post-processor:
        PaliGemma's tokenizer.json prepends <bos> through a TemplateProcessing; the test
        tokenizer's has none and transformers 5 ignores its add_bos_token, so it is set here."""
        if name != hub_tok:
            return tok_orig(name, *a, **k)
        from tokenizers import processors
        t = tok_orig(TOKENIZER_DIR, *a, **k)
        bos = t.convert_tokens_to_ids('<bos>')
        t.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single='<bos> $A', pair='<bos> $A <bos> $B:1', special_tokens=[('<bos>', bos)])
        return t
    transformers.AutoTokenizer.from_pretrained = staticmethod(paligemma_kind)
    for mod in ('converters', 'pipeline', 'batch_processor', 'device_processor', 'rename_processor', 'delta_action_processor',
                'relative_action_processor', 'normalize_processor', 'tokenizer_processor', 'newline_task_processor', 'factory'):
        m = importlib.import_module(f'lerobot.processor.{mod}')
        for k, v in vars(m).items():
            if not k.startswith('_'):
                setattr(proc, k, v)
    import lerobot.lerobot_types as lt
    for k in ('EnvTransition', 'PolicyAction', 'TransitionKey', 'RobotObservation'):
        setattr(proc, k, getattr(lt, k))
    # policies: stub the base class, RTC processor and pi0.5 memory (unused by these paths).
    pkg('lerobot.policies', os.path.join(src, 'policies'))
    pkg('lerobot.policies.common', os.path.join(src, 'policies', 'common'))
    pre = pkg('lerobot.policies.pretrained')

    class PreTrainedPolicy(nn.Module):
        def __init__(self, config, *a, **k):
            super().__init__()
            self.config = config
    pre.PreTrainedPolicy, pre.T = PreTrainedPolicy, TypeVar('T')
    pkg('lerobot.policies.rtc', os.path.join(src, 'policies', 'rtc'))
    pkg('lerobot.policies.rtc.modeling_rtc').RTCProcessor = object
    pkg('lerobot.policies.pi05', os.path.join(src, 'policies', 'pi05'))
    mem = pkg('lerobot.policies.pi05.memory')
    mem.encode_video_with_mem = mem.sample_observation_history = None
    pkg('lerobot.policies.pi0', os.path.join(src, 'policies', 'pi0'))
    pg = importlib.import_module('lerobot.policies.pi_gemma')
    ccm = pg.create_causal_mask  # transformers >= 5.6 dropped cache_position (check_lerobot.py)
    pg.create_causal_mask = lambda *args, cache_position=None, **kw: ccm(*args, **kw)
    out = {}
    for v, name in (('pi0', 'pi0'), ('pi05', 'pi05')):
        c = importlib.import_module(f'lerobot.policies.{name}.configuration_{name}')
        M = importlib.import_module(f'lerobot.policies.{name}.modeling_{name}')
        P = importlib.import_module(f'lerobot.policies.{name}.processor_{name}')
        out[v] = types.SimpleNamespace(config=c, modeling=M, processor=P)
    out['ty'], out['proc'] = ty, proc
    return out


def tiny_sizes(M, cfg: R.RealPiConfig):
    """Swaps LeRobot's hard-coded full sizes for the tiny ones (as check_lerobot.py) and the
    vocabulary for the test tokenizer's, at construction."""
    g = lambda c: M.GemmaConfig(c.width, c.depth, c.mlpDim, c.numHeads, c.numKvHeads, c.headDim)  # noqa: E731
    M.get_gemma_config = lambda variant: {'gemma_2b': g(cfg.vlm), 'gemma_300m': g(cfg.expert)}[variant]
    orig_pg, orig_ex = M.PaliGemmaForConditionalGenerationWithPiGemma, M.PiGemmaForCausalLM
    v = cfg.vision

    def tiny_paligemma(config):
        vc = config.vision_config
        vc.hidden_size, vc.intermediate_size, vc.num_hidden_layers = v.width, v.mlpDim, v.depth
        vc.num_attention_heads, vc.patch_size, vc.image_size = v.numHeads, v.patchSize, v.imageSize
        vc.projection_dim = cfg.vlm.width
        config.projection_dim = cfg.vlm.width
        config.text_config.vocab_size = TEST_VOCAB
        config.image_token_index = TEST_VOCAB
        return orig_pg(config=config)

    def tiny_expert(config):
        config.vocab_size = TEST_VOCAB
        return orig_ex(config=config)
    M.PaliGemmaForConditionalGenerationWithPiGemma = tiny_paligemma
    M.PiGemmaForCausalLM = tiny_expert


def make_config(L, variant: str, cfg: R.RealPiConfig):
    """LeRobot's own PI0Config / PI05Config with the robot's features and the tiny horizon."""
    ty = L['ty']
    F, PF = ty.FeatureType, ty.PolicyFeature
    s = cfg.vision.imageSize
    inputs = {'observation.state': PF(type=F.STATE, shape=(S_DIM,))}
    for cam in CAMERAS:
        inputs[cam] = PF(type=F.VISUAL, shape=(3, s, s))
    outputs = {'action': PF(type=F.ACTION, shape=(A_DIM,))}
    C = L[variant].config.PI0Config if variant == 'pi0' else L[variant].config.PI05Config
    return C(input_features=inputs, output_features=outputs, device='cpu', dtype='float32', chunk_size=cfg.actionHorizon,
             n_action_steps=cfg.actionHorizon, num_inference_steps=cfg.numSteps, max_state_dim=32, max_action_dim=cfg.actionDim,
             tokenizer_max_length=cfg.maxTokenLen, image_resolution=(s, s), push_to_hub=False)


def stats():
    st = {'mean': STATE_MEAN, 'std': STATE_STD, 'q01': STATE_Q01, 'q99': STATE_Q99,
          'min': [a - 0.2 for a in STATE_Q01], 'max': [a + 0.2 for a in STATE_Q99]}
    ac = {'mean': ACTION_MEAN, 'std': ACTION_STD, 'q01': ACTION_Q01, 'q99': ACTION_Q99,
          'min': [a - 0.2 for a in ACTION_Q01], 'max': [a + 0.2 for a in ACTION_Q99]}
    return {'observation.state': {k: f32(v) for k, v in st.items()}, 'action': {k: f32(v) for k, v in ac.items()}}


def tolist(x):
    return np.asarray(x, dtype=np.float64).tolist() if np.asarray(x).dtype.kind == 'f' else np.asarray(x).tolist()


def run(L, variant: str, cfg: R.RealPiConfig) -> dict:
    V = L[variant]
    M = V.modeling
    tiny_sizes(M, cfg)
    config = make_config(L, variant, cfg)
    policy = (M.PI0Policy if variant == 'pi0' else M.PI05Policy)(config)
    # Weights: the contract's init rule (reference.init_params), here with the 1,011-id vocabulary.
    rcfg = R.RealPiConfig(variant, R.GemmaConfig(**{**cfg.vlm.__dict__, 'vocabSize': TEST_VOCAB}), cfg.expert, cfg.vision,
                          actionDim=cfg.actionDim, actionHorizon=cfg.actionHorizon, maxTokenLen=cfg.maxTokenLen, numSteps=cfg.numSteps)
    ref = R.RealPi(rcfg)
    R.init_params(ref)
    sd = {n: p.detach().clone() for n, p in ref.named_parameters()}
    sd['model.paligemma_with_expert.paligemma.lm_head.weight'] = sd['model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight']
    ex = 'model.paligemma_with_expert.gemma_expert.lm_head.weight'
    sd[ex] = torch.from_numpy(R.init_values(ex, TEST_VOCAB * cfg.expert.width).reshape(TEST_VOCAB, cfg.expert.width))
    missing, unexpected = policy.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    policy.eval()

    pre, post = (V.processor.make_pi0_pre_post_processors if variant == 'pi0' else V.processor.make_pi05_pre_post_processors)(config, stats())

    # Raw robot-unit batch, as a LeRobot dataset / robot gives it (images float [0, 1], [B, C, H, W]).
    imgs_u8 = raw_images()
    state, actions = raw_state(variant), raw_actions()
    raw = {'observation.state': torch.from_numpy(state), 'action': torch.from_numpy(actions), 'task': list(TASKS)}
    for c, cam in enumerate(CAMERAS):
        raw[cam] = torch.from_numpy(imgs_u8[:, c].astype(np.float32) / 255.0).permute(0, 3, 1, 2).contiguous()
    batch = pre(raw)
    tokens, tmask = batch['observation.language.tokens'], batch['observation.language.attention_mask']
    tok = pre.steps[[type(s).__name__ for s in pre.steps].index('TokenizerProcessorStep')].input_tokenizer
    prompts = [tok.decode(t[m.bool()].tolist()) for t, m in zip(tokens, tmask)]

    with torch.no_grad():
        images, img_masks = policy._preprocess_images(batch)
        pi0 = variant == 'pi0'
        # pi0.5 reads its state from the prompt only; its padded state is recorded for the kernel check.
        st = policy.prepare_state(batch) if pi0 else M.pad_vector(batch['observation.state'], 32)
        model = policy.model
        # Velocity at given (x_t, t): LeRobot's denoise_step on its prefix cache, as sample_actions does.
        pe, ppad, par = model.embed_prefix(images, img_masks, tokens, tmask)
        att = M.prepare_attention_masks_4d(M.make_att_2d_masks(ppad, par)) if hasattr(M, 'prepare_attention_masks_4d') else model._prepare_attention_masks_4d(M.make_att_2d_masks(ppad, par))
        model.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = 'eager'
        _, kv = model.paligemma_with_expert.forward(attention_mask=att, position_ids=torch.cumsum(ppad, dim=1) - 1,
                                                    past_key_values=None, inputs_embeds=[pe, None], use_cache=True)
        xt_rng = VelaRng(1234)
        x_t = torch.from_numpy(xt_rng.normals(B * cfg.actionHorizon * cfg.actionDim).reshape(B, cfg.actionHorizon, cfg.actionDim))
        tt = torch.tensor(VELOCITY_TIMES, dtype=torch.float32)
        vel = model.denoise_step(*((st,) if pi0 else ()), ppad, kv, x_t, tt)

    # Loss: PI0Policy.forward(reduction="none") with its noise / time draws replaced by Vela's.
    def loss_with(noise, time):
        model.sample_noise = lambda shape, device: torch.from_numpy(noise).float()
        model.sample_time = lambda bsize, device: torch.from_numpy(time).float()
        with torch.no_grad():
            per, _ = policy.forward(batch, reduction='none')
        return per.double().numpy()
    # A session's training generator is Rng(session seed + 0x5eed1) (kernels/trainer.ts): its first
    # forward, and its first forward_backward after a load_state of the state saved before, draw this.
    fb_noise, fb_time = draw_noise_time(VelaRng(SESSION_SEED + 0x5EED1), B, cfg.actionHorizon, cfg.actionDim)
    fwd_noise, fwd_time = fb_noise, fb_time
    loss_fwd, loss_fb = loss_with(fwd_noise, fwd_time), loss_with(fb_noise, fb_time)
    with torch.no_grad():
        a_norm = policy.prepare_action(batch)
        tt = torch.from_numpy(fwd_time)[:, None, None]
        fwd_xt = tt * torch.from_numpy(fwd_noise) + (1 - tt) * a_norm
        fwd_vel = model.denoise_step(*((st,) if pi0 else ()), ppad, kv, fwd_xt, torch.from_numpy(fwd_time))

        # 10-step sample (normalised, [B, 10, 6]) and its unnormalised actions (robot units).
        def sample(noise):
            a = policy.predict_action_chunk(batch, noise=torch.from_numpy(noise).float())
            return a, post(a)
        s_noise = VelaRng(SAMPLE_SEED).normals(B * cfg.actionHorizon * cfg.actionDim).reshape(B, cfg.actionHorizon, cfg.actionDim)
        s_norm, s_robot = sample(s_noise)
        p_noise = np.stack([VelaRng(policy_seed(POLICY_SEED, 0, n)).normals(cfg.actionHorizon * cfg.actionDim).reshape(cfg.actionHorizon, cfg.actionDim) for n in range(B)])
        # vela policy answers one observation per request (n = 0, 1 on stream 0): datum n alone.
        p_norm, p_robot = [], []
        for n in range(B):
            one = {k: (v[n:n + 1] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
            a = policy.predict_action_chunk(one, noise=torch.from_numpy(p_noise[n:n + 1]).float())
            p_norm.append(a[0].numpy())
            p_robot.append(post(a)[0].numpy())

    # pi0.5's prompt without state (LeRobot's include_state_in_prompt=False, use_proprioceptive_memory).
    no_state = None
    if not pi0:
        P = V.processor
        step = P.Pi05PrepareStateTokenizerProcessorStep(max_state_dim=32, include_state_in_prompt=False)
        tr = {L['proc'].TransitionKey.OBSERVATION: {'observation.state': batch['observation.state']},
              L['proc'].TransitionKey.COMPLEMENTARY_DATA: {'task': list(TASKS)}}
        texts = step(tr)[L['proc'].TransitionKey.COMPLEMENTARY_DATA]['task']
        ids = tok(texts, max_length=cfg.maxTokenLen, truncation=True, padding='max_length', padding_side='right', return_tensors='pt')
        no_state = {'prompts': texts, 'tokens': tolist(ids['input_ids']), 'masks': tolist(ids['attention_mask'])}

    out = {
        'config': rcfg.to_json(),
        'tasks': TASKS,
        'prompt_text': prompts,
        'tokens': tolist(tokens), 'token_masks': tolist(tmask.int()),
        'image_masks': tolist(torch.stack(img_masks, 1).int()),
        'state_raw': tolist(state), 'state_normalized': tolist(batch['observation.state']),
        'state_padded': tolist(st),
        'actions_raw': tolist(actions), 'actions_normalized': tolist(batch['action']),
        'velocity': {'x_t_seed': 1234, 'x_t': tolist(x_t), 'time': VELOCITY_TIMES, 'velocity': tolist(vel)},
        'forward': {'session_seed': SESSION_SEED, 'rng_seed': SESSION_SEED + 0x5EED1, 'noise': tolist(fwd_noise), 'time': tolist(fwd_time), 'x_t': tolist(fwd_xt),
                    'velocity': tolist(fwd_vel), 'target': tolist(torch.from_numpy(fwd_noise) - a_norm), 'loss_per_datum': tolist(loss_fwd)},
        'forward_backward': {'session_seed': SESSION_SEED, 'rng_seed': SESSION_SEED + 0x5EED1, 'noise': tolist(fb_noise),
                             'time': tolist(fb_time), 'loss_per_datum': tolist(loss_fb), 'loss': float(loss_fb.mean())},
        'sample': {'seed': SAMPLE_SEED, 'noise': tolist(s_noise), 'actions_normalized': tolist(s_norm), 'actions_robot': tolist(s_robot)},
        'policy': {'seed': POLICY_SEED, 'stream': 0, 'request_seeds': [policy_seed(POLICY_SEED, 0, n) for n in range(B)],
                   'noise': tolist(p_noise), 'actions_normalized': tolist(np.stack(p_norm)), 'actions_robot': tolist(np.stack(p_robot))},
    }
    if not pi0:
        out['state_bins'] = tolist(R.discretize_state(batch['observation.state'].numpy()))
        out['prompt_without_state'] = no_state

    # The checkpoint folder, as LeRobot's save_pretrained calls write it.
    folder = Path(FIXTURES) / f'lerobot_tiny_{variant}'
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    config._save_pretrained(folder)  # PreTrainedConfig._save_pretrained: json.dump(draccus.encode(self, PreTrainedConfig))
    cj = json.loads((folder / 'config.json').read_text())
    cj['vela_real_pi_config'] = out['config']  # the tiny sizes, which LeRobot's config cannot name (docs/MODEL.md)
    (folder / 'config.json').write_text(json.dumps(cj, indent=4))
    from huggingface_hub import save_torch_state_dict
    save_torch_state_dict(policy.state_dict(), str(folder), max_shard_size='1000GB')  # PreTrainedPolicy._save_pretrained
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    out['folder'] = os.path.relpath(folder, ROOT)
    out['folder_files'] = sorted(str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument('--lerobot-src', required=True, help="path to a LeRobot checkout's src/lerobot")
    a = ap.parse_args()
    torch.set_num_threads(1)
    L = load_lerobot(os.path.abspath(a.lerobot_src), None)
    res = {'lerobot_commit': os.environ.get('LEROBOT_COMMIT', 'unknown'),
           'note': 'written by scripts/real_pi/make_lerobot_e2e.py; LeRobot float32 on the contract init with a 1,011-id vocabulary',
           'tiny_pi0': run(L, 'pi0', R.REAL_PI_TINY_PI0), 'tiny_pi05': run(L, 'pi05', R.REAL_PI_TINY_PI05)}
    with open(OUT_JSON, 'w') as f:
        json.dump(res, f, indent=1)
        f.write('\n')
    print('wrote', OUT_JSON)
    return 0


if __name__ == '__main__':
    sys.exit(main())
