"""PyTorch reference of the real pi0 and pi0.5 (PaliGemma + Gemma action expert), written from
../shared/spec/real-pi/FACTS.md (section numbers below are FACTS sections), not copied from
LeRobot, openpi or transformers. It exists to produce parity vectors for the TF.js model
(scripts/real_pi/make_vectors.py) and to check names/shapes at full size (check_meta.py). Checked
against transformers' PI0 (check_transformers.py) and LeRobot's own PI0Pytorch / PI05Pytorch
(check_lerobot.py): equal at the float32 noise floor (numbers in README.md).

Axis legend for shape comments: b batch, c cameras, p prefix tokens, s suffix tokens, t query
tokens, k key tokens, h query heads, kv key/value heads, hd head dim, w width, ah action horizon,
ad action dim (32), l prompt tokens, n patches per camera.

Parameter names are exactly LeRobot's runtime state-dict names (pi0_state_dict.json /
pi05_state_dict.json, with the policy's `model.` prefix), shapes in PyTorch layout (Linear
weight [out, in]). The two LM heads (`paligemma.lm_head`, `gemma_expert.lm_head`) are NOT
parameters here: pi0 never decodes text, so they are dead weight (FACTS 1.4, 2.2 items 2-3);
check_meta.py compares against the JSON minus those two names.

Choices where the references disagree (FACTS section 7) or leave room; LeRobot's wins:
  C1 loss: per datum, the mean over horizon AND all 32 action dims (the contract's / openpi's
     reduction). LeRobot truncates to the robot's real action dims before averaging; in the
     vectors all 32 dims are real, so the two agree.
  C2 time embedding e(t): computed in float64 and rounded to the model dtype (LeRobot and
     openpi-PyTorch; openpi-JAX computes in float32).
  C3 missing cameras: masked (tokens computed, invalid for attention and positions), in the order
     given. LeRobot additionally moves absent camera *features* to the end of the camera list;
     that is pre-processing (which slot a camera goes in), not part of the model, and a per-datum
     mask (as in the vectors) never reorders.
  C4 prompt cleaning, pi0: none beyond appending "\n" to the task and tokenizing text+"\n" in one
     pass (LeRobot). openpi also replaces "_" and newlines by spaces and tokenizes "\n" apart.
     pi0.5: the cleaning of FACTS 1.10 (strip, "_" and newline -> space), as both do.
  C5 masked attention logits: the finite constant -2.3819763e38 is ADDED to masked logits
     (LeRobot / openpi-PyTorch; JAX replaces them). Identical for every valid query; a fully
     masked (padding) query row becomes a uniform average, whose output is never used.
  C6 query scaling: logits = (q . k) * head_dim^-0.5 after RoPE (scaling the logits, as the
     PyTorch ports do; JAX scales q first; equal up to rounding).
  C7 dtype: everything in one dtype (LeRobot's default float32; the vectors use float64, a
     truth ~1e-7 closer than any float32 run, see make_vectors.py). No bf16 islands.
  C8 normalisation eps (1e-8 vs 1e-6) and image resizing are outside the model: the inputs are
     already normalised and 56x56 / 224x224.
  C9 sampling times: t_k = 1 - k/N computed in float64 and rounded to the dtype (k = 0..N-1);
     LeRobot (and transformers) compute 1.0 + k*dt in Python floats, then float32: the same
     float32 values.
  C10 the prefix K/V cache holds post-RoPE keys and values per layer, and is never extended by the
     suffix (FACTS 1.6).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# FACTS 1.4: the finite "minus infinity" of the PyTorch ports, added to masked logits.
MASK_NEG = -2.3819763e38
RMS_EPS = 1e-6  # Gemma RMSNorm and adaRMSNorm (FACTS 1.4, 1.9)
LN_EPS = 1e-6  # SigLIP LayerNorm (FACTS 1.2)
ROPE_BASE = 10_000.0  # FACTS 1.4
MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0  # time embedding (FACTS 1.11)


# ----------------------------------------------------------------------------------------------
# Configuration (field names mirror the TS `RealPiConfig` of kernels/pi/config.ts)


@dataclass(frozen=True)
class GemmaConfig:
    width: int
    depth: int
    mlpDim: int
    numHeads: int
    numKvHeads: int
    headDim: int
    vocabSize: Optional[int] = None  # None: no token embedding (the action expert)


@dataclass(frozen=True)
class VisionConfig:
    width: int
    depth: int
    mlpDim: int
    numHeads: int
    patchSize: int
    imageSize: int


@dataclass(frozen=True)
class RealPiConfig:
    variant: str  # 'pi0' | 'pi05'
    vlm: GemmaConfig
    expert: GemmaConfig
    vision: VisionConfig
    actionDim: int
    actionHorizon: int
    maxTokenLen: int
    numSteps: int

    def __post_init__(self):
        if self.variant not in ('pi0', 'pi05'):
            raise ValueError(f"variant is {self.variant!r}; expected 'pi0' or 'pi05'")
        for k in ('depth', 'numHeads', 'numKvHeads', 'headDim'):
            if getattr(self.vlm, k) != getattr(self.expert, k):
                raise ValueError(f'vlm.{k} = {getattr(self.vlm, k)} but expert.{k} = {getattr(self.expert, k)}; the shared attention needs them equal')
        if self.vision.imageSize % self.vision.patchSize:
            raise ValueError(f'vision.imageSize {self.vision.imageSize} is not a multiple of patchSize {self.vision.patchSize}')
        if self.expert.width % 2:
            raise ValueError(f'expert.width {self.expert.width} must be even (sin/cos time embedding)')

    @property
    def tokens_per_camera(self) -> int:
        return (self.vision.imageSize // self.vision.patchSize) ** 2

    def to_json(self) -> dict:
        """The TS RealPiConfig fields (the expert has no vocabSize)."""
        d = asdict(self)
        del d['expert']['vocabSize']
        return d


_VLM_2B = GemmaConfig(width=2048, depth=18, mlpDim=16384, numHeads=8, numKvHeads=1, headDim=256, vocabSize=257152)
_EXPERT_300M = GemmaConfig(width=1024, depth=18, mlpDim=4096, numHeads=8, numKvHeads=1, headDim=256)
_SO400M = VisionConfig(width=1152, depth=27, mlpDim=4304, numHeads=16, patchSize=14, imageSize=224)
REAL_PI0 = RealPiConfig('pi0', _VLM_2B, _EXPERT_300M, _SO400M, actionDim=32, actionHorizon=50, maxTokenLen=48, numSteps=10)
REAL_PI05 = replace(REAL_PI0, variant='pi05', maxTokenLen=200)

# FACTS 5.2, horizon 10 to keep the vectors small.
_VLM_TINY = GemmaConfig(width=64, depth=4, mlpDim=128, numHeads=8, numKvHeads=1, headDim=16, vocabSize=257152)
_EXPERT_TINY = GemmaConfig(width=32, depth=4, mlpDim=64, numHeads=8, numKvHeads=1, headDim=16)
_VISION_TINY = VisionConfig(width=32, depth=2, mlpDim=64, numHeads=2, patchSize=14, imageSize=56)
REAL_PI_TINY_PI0 = RealPiConfig('pi0', _VLM_TINY, _EXPERT_TINY, _VISION_TINY, actionDim=32, actionHorizon=10, maxTokenLen=48, numSteps=10)
REAL_PI_TINY_PI05 = replace(REAL_PI_TINY_PI0, variant='pi05', maxTokenLen=200)

PRESETS = {'tiny_pi0': REAL_PI_TINY_PI0, 'tiny_pi05': REAL_PI_TINY_PI05, 'pi0': REAL_PI0, 'pi05': REAL_PI05}


# ----------------------------------------------------------------------------------------------
# The pi0.5 state prompt (FACTS 1.10) and the toy vocabulary the vectors use instead of
# PaliGemma's SentencePiece model (the vectors carry token ids; the tokenizer is tested elsewhere).

TOY_PAD, TOY_BOS = 0, 2  # Gemma's <pad> and <bos> ids
TOY_CHAR_BASE = 257152 - 128  # ASCII char c -> id 257024 + ord(c): the table's last 128 rows


def discretize_state(state: np.ndarray) -> np.ndarray:
    """pi0.5 state bins (FACTS 1.10): 256 equal bins on [-1, 1] found by numpy `digitize` over the
    256 left edges, minus 1. x < -1 gives -1 (no clipping), x >= 1 - 2/256 gives 255.
    state: float [..., n] (the normalised, UNPADDED state) -> int64 [..., n]."""
    edges = np.linspace(-1.0, 1.0, 256 + 1)[:-1]
    return np.digitize(np.asarray(state, dtype=np.float64), bins=edges) - 1


def clean_task(text: str) -> str:
    """pi0.5 task cleaning (FACTS 1.10): strip, then '_' and newlines become spaces."""
    return text.strip().replace('_', ' ').replace('\n', ' ')


def pi05_prompt(task: str, state: Optional[np.ndarray]) -> str:
    """The pi0.5 prompt string: `Task: <task>, State: <b1> ... <bn>;\\nAction: ` (FACTS 1.10).
    state None: the variant without state (openpi's pi05_libero), which uses the pi0 format."""
    if state is None:
        return clean_task(task) + '\n'
    bins = ' '.join(str(int(b)) for b in discretize_state(state))
    return f'Task: {clean_task(task)}, State: {bins};\nAction: '


def pi0_prompt(task: str) -> str:
    """The pi0 prompt string as LeRobot builds it: the task with "\\n" appended (choice C4)."""
    return task + '\n'


def toy_tokenize(text: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Toy tokenizer: BOS, then one id per ASCII character (257024 + code point), right-padded
    with id 0 to max_len (truncated to max_len). Returns (ids int32 [l], mask int32 [l])."""
    if any(ord(c) >= 128 for c in text):
        raise ValueError(f'toy vocabulary is ASCII only; got {text!r}')
    ids = [TOY_BOS] + [TOY_CHAR_BASE + ord(c) for c in text]
    ids = ids[:max_len]
    mask = [1] * len(ids) + [0] * (max_len - len(ids))
    return np.array(ids + [TOY_PAD] * (max_len - len(ids)), dtype=np.int32), np.array(mask, dtype=np.int32)


# ----------------------------------------------------------------------------------------------
# Blocks


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate='tanh')


class RMSNorm(nn.Module):
    """Gemma RMSNorm: x * rsqrt(mean(x^2) + 1e-6) * (1 + w); w is an offset stored as `weight`."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x, cond=None):
        if cond is not None:
            raise ValueError('a plain RMSNorm takes no condition (only the pi0.5 expert norms are adaptive)')
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return y * (1 + self.weight), None


class AdaRMSNorm(nn.Module):
    """pi0.5 adaptive RMSNorm (FACTS 1.9): (scale, shift, gate) = dense(cond) split in 3 along
    features; y = rms(x) * (1 + scale) + shift; the gate multiplies the sublayer's output in the
    residual (gate, not 1 + gate). No learned scale of its own."""

    def __init__(self, dim: int):
        super().__init__()
        self.dense = nn.Linear(dim, 3 * dim)

    def forward(self, x, cond):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)  # [b, t, w]
        scale, shift, gate = self.dense(cond)[:, None, :].chunk(3, dim=-1)  # [b, 1, w] each
        return y * (1 + scale) + shift, gate


class GemmaAttention(nn.Module):
    """Q/K/V/O projections of one stream (no biases). The attention itself is joint (joint_layer)."""

    def __init__(self, c: GemmaConfig):
        super().__init__()
        self.q_proj = nn.Linear(c.width, c.numHeads * c.headDim, bias=False)
        self.k_proj = nn.Linear(c.width, c.numKvHeads * c.headDim, bias=False)
        self.v_proj = nn.Linear(c.width, c.numKvHeads * c.headDim, bias=False)
        self.o_proj = nn.Linear(c.numHeads * c.headDim, c.width, bias=False)


class GemmaMLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x)), no biases."""

    def __init__(self, c: GemmaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.width, c.mlpDim, bias=False)
        self.up_proj = nn.Linear(c.width, c.mlpDim, bias=False)
        self.down_proj = nn.Linear(c.mlpDim, c.width, bias=False)

    def forward(self, x):
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class GemmaLayer(nn.Module):
    def __init__(self, c: GemmaConfig, ada: bool):
        super().__init__()
        norm = AdaRMSNorm if ada else RMSNorm
        self.self_attn = GemmaAttention(c)
        self.mlp = GemmaMLP(c)
        self.input_layernorm = norm(c.width)
        self.post_attention_layernorm = norm(c.width)


class GemmaStack(nn.Module):
    """Layers + final norm (+ the token embedding when the config has a vocabulary)."""

    def __init__(self, c: GemmaConfig, ada: bool):
        super().__init__()
        if c.vocabSize is not None:
            self.embed_tokens = nn.Embedding(c.vocabSize, c.width)
        self.layers = nn.ModuleList(GemmaLayer(c, ada) for _ in range(c.depth))
        self.norm = (AdaRMSNorm if ada else RMSNorm)(c.width)


class SiglipAttention(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.heads = c.numHeads
        for n in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
            setattr(self, n, nn.Linear(c.width, c.width))

    def forward(self, x):  # [b, n, w], full bidirectional
        b, n, w = x.shape
        hd = w // self.heads
        q, k, v = (p(x).view(b, n, self.heads, hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        att = torch.softmax((q @ k.transpose(-1, -2)) * hd ** -0.5, dim=-1)  # [b, h, n, n]
        return self.out_proj((att @ v).transpose(1, 2).reshape(b, n, w))


class SiglipMLP(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.width, c.mlpDim)
        self.fc2 = nn.Linear(c.mlpDim, c.width)

    def forward(self, x):
        return self.fc2(gelu_tanh(self.fc1(x)))


class SiglipLayer(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c.width, eps=LN_EPS)
        self.self_attn = SiglipAttention(c)
        self.layer_norm2 = nn.LayerNorm(c.width, eps=LN_EPS)
        self.mlp = SiglipMLP(c)

    def forward(self, x):  # pre-LayerNorm block
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, c.width, kernel_size=c.patchSize, stride=c.patchSize)
        self.position_embedding = nn.Embedding((c.imageSize // c.patchSize) ** 2, c.width)


class SiglipEncoder(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(c) for _ in range(c.depth))


class SiglipTower(nn.Module):
    """SigLIP (FACTS 1.2): conv patches + learned position embedding, pre-LN blocks, final LN, no
    pooling head. [b, 3, H, W] in [-1, 1] -> [b, n, w], patches row-major over the grid."""

    def __init__(self, c: VisionConfig):
        super().__init__()
        self.embeddings = SiglipEmbeddings(c)
        self.encoder = SiglipEncoder(c)
        self.post_layernorm = nn.LayerNorm(c.width, eps=LN_EPS)

    def forward(self, img):
        x = self.embeddings.patch_embedding(img).flatten(2).transpose(1, 2)  # [b, n, w]
        x = x + self.embeddings.position_embedding.weight[None]
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class Projector(nn.Module):
    def __init__(self, vision: int, width: int):
        super().__init__()
        self.linear = nn.Linear(vision, width)


class PaliGemmaModel(nn.Module):
    def __init__(self, cfg: RealPiConfig):
        super().__init__()
        self.vision_tower = SiglipTower(cfg.vision)
        self.multi_modal_projector = Projector(cfg.vision.width, cfg.vlm.width)
        self.language_model = GemmaStack(cfg.vlm, ada=False)


class _Holder(nn.Module):
    """A bare `.model` level, so that the names match LeRobot's (`paligemma.model....`)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.model = inner


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, cfg: RealPiConfig):
        super().__init__()
        self.paligemma = _Holder(PaliGemmaModel(cfg))
        self.gemma_expert = _Holder(GemmaStack(cfg.expert, ada=cfg.variant == 'pi05'))


# ----------------------------------------------------------------------------------------------
# Attention pieces shared by both streams


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE, half-split convention (FACTS 1.4): pairs (x_j, x_{j+hd/2}), inv_freq_j = base^(-2j/hd).
    x [b, t, h, hd], pos int [b, t]."""
    hd = x.shape[-1]
    half = hd // 2
    inv_freq = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64) * 2 / hd)  # [hd/2]
    ang = (pos.to(torch.float64)[..., None] * inv_freq).to(x.dtype)  # [b, t, hd/2]
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attend(q, k, v, mask):
    """Multi-query attention. q [b, t, h, hd], k/v [b, k, kv, hd], mask bool [b, t, k]
    -> [b, t, h*hd]. Masked logits get MASK_NEG added (choice C5)."""
    b, t, h, hd = q.shape
    rep = h // k.shape[2]
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    logits = torch.einsum('bthd,bkhd->bhtk', q, k) * hd ** -0.5  # [b, h, t, k]
    logits = logits + torch.where(mask[:, None], 0.0, MASK_NEG).to(logits.dtype)
    p = torch.softmax(logits, dim=-1)
    return torch.einsum('bhtk,bkhd->bthd', p, v).reshape(b, t, h * hd)


def make_att_2d(pad: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """Prefix-LM mask with blocks (FACTS 1.7): i sees j iff cum_j <= cum_i and both valid.
    pad bool [b, n], ar int [b, n] -> bool [b, n, n]."""
    cum = torch.cumsum(ar, dim=1)
    return (cum[:, None, :] <= cum[:, :, None]) & pad[:, None, :] & pad[:, :, None]


def time_embedding(t: torch.Tensor, dim: int, dtype) -> torch.Tensor:
    """e(t) (FACTS 1.11): [sin(2*pi*t/period_i), cos(...)], period_i = 4e-3 * (4/4e-3)^(i/(dim/2-1)),
    computed in float64 then rounded to dtype (choice C2). t [b] -> [b, dim]."""
    half = dim // 2
    frac = torch.linspace(0.0, 1.0, half, dtype=torch.float64)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** frac
    ang = t.to(torch.float64)[:, None] * (2 * math.pi / period)[None]  # [b, dim/2]
    return torch.cat([ang.sin(), ang.cos()], dim=-1).to(dtype)


# ----------------------------------------------------------------------------------------------
# The model


class PiCore(nn.Module):
    """LeRobot's `PI0Pytorch` / `PI05Pytorch` level: the VLM + expert and the action projections."""

    def __init__(self, cfg: RealPiConfig):
        super().__init__()
        self.cfg = cfg
        ew = cfg.expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(cfg)
        self.action_in_proj = nn.Linear(cfg.actionDim, ew)
        self.action_out_proj = nn.Linear(ew, cfg.actionDim)
        if cfg.variant == 'pi0':
            self.state_proj = nn.Linear(cfg.actionDim, ew)  # state padded to the action dim (32)
            self.action_time_mlp_in = nn.Linear(2 * ew, ew)
            self.action_time_mlp_out = nn.Linear(ew, ew)
        else:
            self.time_mlp_in = nn.Linear(ew, ew)
            self.time_mlp_out = nn.Linear(ew, ew)

    # -- parts ------------------------------------------------------------------------------
    @property
    def _pg(self) -> PaliGemmaModel:
        return self.paligemma_with_expert.paligemma.model

    @property
    def _expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    def embed_images(self, images):
        """images [b, c, 3, H, W] -> (SigLIP output [b, c, n, wv], projected [b, c, n, w])."""
        b, c = images.shape[:2]
        vis = self._pg.vision_tower(images.flatten(0, 1))  # [b*c, n, wv]
        proj = self._pg.multi_modal_projector.linear(vis)  # no 1/sqrt(w) (FACTS 1.3)
        return vis.unflatten(0, (b, c)), proj.unflatten(0, (b, c))

    def embed_prefix(self, images, image_masks, tokens, token_masks):
        """Prefix = per camera its n image tokens, then the prompt tokens (FACTS 1.1).
        Returns embs [b, p, w], pad bool [b, p], ar int [b, p] (all 0: bidirectional prefix),
        and the SigLIP outputs [b, c, n, wv] for debugging."""
        vis, proj = self.embed_images(images)
        b, c, n, w = proj.shape
        emb = self._pg.language_model.embed_tokens(tokens.long()) * math.sqrt(w)  # text only
        embs = torch.cat([proj.reshape(b, c * n, w), emb], dim=1)
        pad = torch.cat([image_masks.bool()[:, :, None].expand(b, c, n).reshape(b, c * n), token_masks.bool()], dim=1)
        return embs, pad, torch.zeros_like(pad, dtype=torch.long), vis

    def embed_suffix(self, state, x_t, t):
        """pi0: [state token, action tokens mixed with e(t) by the action-time MLP] (FACTS 1.8);
        pi0.5: action tokens, and the adaRMS conditioning vector (FACTS 1.9).
        Returns embs [b, s, we], pad bool [b, s], ar int [b, s], cond [b, we] or None, e(t)."""
        b, ah, _ = x_t.shape
        ew = self.cfg.expert.width
        te = time_embedding(t, ew, x_t.dtype)  # [b, we]
        act = self.action_in_proj(x_t)  # [b, ah, we]
        if self.cfg.variant == 'pi0':
            st = self.state_proj(state)[:, None]  # [b, 1, we]
            h = torch.cat([act, te[:, None].expand(b, ah, ew)], dim=-1)
            h = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(h)))  # no activation after
            embs = torch.cat([st, h], dim=1)
            ar = [1, 1] + [0] * (ah - 1)  # state its own block; the actions one block after it
            cond = None
        else:
            embs = act
            ar = [1] + [0] * (ah - 1)
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(te))))  # swish after both
        s = embs.shape[1]
        pad = torch.ones(b, s, dtype=torch.bool)
        return embs, pad, torch.tensor(ar, dtype=torch.long)[None].expand(b, s), cond, te

    def joint(self, prefix, suffix, mask, pos, cond, cache=None, fill_cache=False, debug=None):
        """The layer stack with one attention per layer over [prefix; suffix] (FACTS 1.6). Either
        stream may be None. cache: list of per-layer (k, v) [b, p, kv, hd] of the prefix, post-RoPE,
        prepended to the keys (suffix-only pass). mask bool [b, t, k] over the keys incl. cache;
        pos int [b, t] for the present tokens. debug: a dict that receives both streams after layer 0.
        Returns (prefix_out, suffix_out, new cache)."""
        vlm, exp = self._pg.language_model, self._expert
        h = self.cfg.vlm.numHeads
        kvh, hd = self.cfg.vlm.numKvHeads, self.cfg.vlm.headDim
        streams = [(prefix, vlm, None), (suffix, exp, cond)]
        new_cache = []
        for i in range(self.cfg.vlm.depth):
            qs, ks, vs, gates, lens = [], [], [], [], []
            for x, stack, cnd in streams:
                if x is None:
                    gates.append(None)
                    lens.append(0)
                    continue
                layer = stack.layers[i]
                y, g = layer.input_layernorm(x, cnd)
                b, t, _ = y.shape
                qs.append(layer.self_attn.q_proj(y).view(b, t, h, hd))
                ks.append(layer.self_attn.k_proj(y).view(b, t, kvh, hd))
                vs.append(layer.self_attn.v_proj(y).view(b, t, kvh, hd))
                gates.append(g)
                lens.append(t)
            q = rope(torch.cat(qs, dim=1), pos)
            k = rope(torch.cat(ks, dim=1), pos)
            v = torch.cat(vs, dim=1)
            if fill_cache:
                new_cache.append((k, v))
            if cache is not None:
                k = torch.cat([cache[i][0], k], dim=1)
                v = torch.cat([cache[i][1], v], dim=1)
            att = attend(q, k, v, mask)  # [b, t, h*hd]
            outs = list(att.split(lens, dim=1))
            nxt = []
            for (x, stack, cnd), a, g in zip(streams, outs, gates):
                if x is None:
                    nxt.append(None)
                    continue
                layer = stack.layers[i]
                o = layer.self_attn.o_proj(a)
                x = x + (o if g is None else o * g)
                y, g2 = layer.post_attention_layernorm(x, cnd)
                m = layer.mlp(y)
                nxt.append(x + (m if g2 is None else m * g2))
            streams = [(x, s, c) for x, (_, s, c) in zip(nxt, streams)]
            if debug is not None and i == 0:
                debug.update(prefix_after_layer0=nxt[0], suffix_after_layer0=nxt[1])
        outs = [None if x is None else stack.norm(x, cnd)[0] for x, stack, cnd in streams]  # final gates dropped
        return outs[0], outs[1], new_cache

    # -- public --------------------------------------------------------------------------------
    def velocity(self, images, image_masks, tokens, token_masks, state, x_t, t, debug=None):
        """v(x_t, t) with the whole sequence in one pass (the training forward).
        images [b, c, 3, H, W] in [-1, 1]; image_masks [b, c]; tokens/token_masks [b, l];
        state [b, 32] (pi0 only; pi0.5 reads its state from the prompt); x_t [b, ah, 32]; t [b].
        Returns [b, ah, 32]. debug: a dict that receives intermediate tensors."""
        pe, ppad, par, vis = self.embed_prefix(images, image_masks, tokens, token_masks)
        se, spad, sar, cond, te = self.embed_suffix(state, x_t, t)
        pad = torch.cat([ppad, spad], dim=1)
        mask = make_att_2d(pad, torch.cat([par, sar], dim=1))
        pos = torch.cumsum(pad.long(), dim=1) - 1  # positions over valid tokens (FACTS 1.4)
        _, out, _ = self.joint(pe, se, mask, pos, cond, debug=debug)
        v = self.action_out_proj(out[:, -x_t.shape[1]:])
        if debug is not None:
            debug.update(siglip=vis, prefix_embs=pe, suffix_embs=se, att_mask=mask, positions=pos,
                         time_emb=te, suffix_out=out, **({} if cond is None else {'adarms_cond': cond}))
        return v

    def loss(self, images, image_masks, tokens, token_masks, state, actions, noise, t, debug=None):
        """Flow-matching loss per datum (FACTS 1.12, choice C1): x_t = t*noise + (1-t)*actions,
        u = noise - actions, mean over horizon and action dims of (v - u)^2. -> ([b], v [b, ah, 32])."""
        tt = t[:, None, None]
        x_t = tt * noise + (1 - tt) * actions
        v = self.velocity(images, image_masks, tokens, token_masks, state, x_t, t, debug)
        return (v - (noise - actions)).pow(2).mean(dim=(1, 2)), v

    @torch.no_grad()
    def sample(self, images, image_masks, tokens, token_masks, state, noise, num_steps=None, debug=None):
        """Euler from t = 1 (noise) to t = 0 with dt = -1/N (FACTS 1.12); the prefix runs once and
        its per-layer K/V are reused by every step (choice C10). noise [b, ah, 32] -> [b, ah, 32]."""
        n = num_steps or self.cfg.numSteps
        pe, ppad, par, _ = self.embed_prefix(images, image_masks, tokens, token_masks)
        ppos = torch.cumsum(ppad.long(), dim=1) - 1
        _, _, cache = self.joint(pe, None, make_att_2d(ppad, par), ppos, None, fill_cache=True)
        n_valid = ppad.long().sum(dim=1, keepdim=True)  # [b, 1]
        x = noise
        dt = -1.0 / n
        for k in range(n):
            t = torch.full((x.shape[0],), 1.0 - k / n, dtype=torch.float64).to(x.dtype)  # choice C9
            se, spad, sar, cond, _ = self.embed_suffix(state, x, t)
            s = se.shape[1]
            mask = torch.cat([ppad[:, None, :].expand(-1, s, -1), make_att_2d(spad, sar)], dim=2)
            pos = n_valid + torch.cumsum(spad.long(), dim=1) - 1
            _, out, _ = self.joint(None, se, mask, pos, cond, cache=cache)
            v = self.action_out_proj(out[:, -x.shape[1]:])
            if debug is not None and k == 0:
                debug['sample_velocity_t1'] = v
            x = x + dt * v
        return x


class RealPi(nn.Module):
    """The policy level: LeRobot's `PI0Policy` holds the model as `.model`, hence the `model.` prefix."""

    def __init__(self, cfg: RealPiConfig):
        super().__init__()
        self.model = PiCore(cfg)

    @property
    def cfg(self) -> RealPiConfig:
        return self.model.cfg


EMBED_NAME = 'model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight'
LM_HEAD_NAMES = ('model.paligemma_with_expert.paligemma.lm_head.weight', 'model.paligemma_with_expert.gemma_expert.lm_head.weight')


# ----------------------------------------------------------------------------------------------
# The contract's deterministic parameter init (pi-common.md, contract 3)

_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619
_M32 = 0xFFFFFFFF


def fnv1a32(name: str) -> int:
    """FNV-1a 32-bit of the UTF-8 bytes of name."""
    h = _FNV_OFFSET
    for byte in name.encode('utf-8'):
        h = ((h ^ byte) * _FNV_PRIME) & _M32
    return h


def _imul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b) & _M32  # uint64 holds the full 64-bit product of two uint32


def mulberry32_uniform(seed: int, start: int, count: int) -> np.ndarray:
    """Elements start..start+count-1 of the mulberry32 stream from seed, as float64 in [0, 1).
    The state after i+1 draws is seed + (i+1) * 0x6D2B79F5 (mod 2^32), so any slice is direct."""
    i = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    t = (np.uint64(seed) + i * np.uint64(0x6D2B79F5)) & np.uint64(_M32)
    t = _imul(t ^ (t >> np.uint64(15)), t | np.uint64(1))
    t = t ^ ((t + _imul(t ^ (t >> np.uint64(7)), t | np.uint64(61))) & np.uint64(_M32))
    return (t ^ (t >> np.uint64(14))).astype(np.float64) / 4294967296.0


def init_values(name: str, n: int, start: int = 0, count: Optional[int] = None) -> np.ndarray:
    """value_i = float32((2 u_i - 1) * 0.05) for the parameter `name` (row-major), elements
    start..start+count-1 (default: all n)."""
    count = n - start if count is None else count
    return ((2.0 * mulberry32_uniform(fnv1a32(name), start, count) - 1.0) * 0.05).astype(np.float32)


def init_params(model: nn.Module) -> None:
    """Sets every parameter by the contract's rule (float32 values, cast to the model's dtype)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            vals = init_values(name, p.numel()).reshape(tuple(p.shape))
            p.copy_(torch.from_numpy(vals).to(p.dtype))


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
