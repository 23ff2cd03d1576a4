"""PyTorch reference of Vela's pi0 and pi0.5 policies (docs/MODEL.md), for the bench's speed ratio, the
recipe table's same-budget comparison (bench/torch_finetune.py) and a parity check against Vela.

Builds `flow05-tiny`, `flow0-tiny` (or the small presets) exactly as MODEL.md and kernels/small/model.ts
describe them: the same parameter table (2,202,272 parameters for flow05-tiny, 1,790,752 for flow0-tiny,
checked), the same token layout (only the image slots that hold a frame are computed, D13), the
same last prefix layer that computes only keys and values; pi0.5: state bins in the prefix and
adaptive RMSNorm in the action expert; pi0: the state as one suffix token and the time mixed into
the action tokens; GELU (tanh), masked MSE flow-matching loss per datum, then AdamW
(torch.optim.AdamW, betas 0.9 / 0.95, eps 1e-12, no weight decay) after the global gradient norm, as
Vela's optim_step. It times that training step on the CPU.

    python3 bench/torch_reference.py --batch 8 --cameras 1 --threads 1,2 --steps 20 [--preset flow0-tiny]

Prints one JSON object on stdout: {"torch_version", "params", "rows": [{"threads", "batch",
"cameras", "step_ms": [...]}]}. Needs torch and numpy (CPU is enough); nothing else of the project.

With --serve it builds one model per thread count, runs the burn-in steps, prints the JSON object
with empty rows, then times steps on request: each stdin line {"threads": T, "steps": N} is
answered by one stdout line {"threads": T, "step_ms": [...]}. The bench uses this to interleave
PyTorch steps with Vela's, so a shared machine's changing load falls on both alike.

With --parity DIR (run by `npx tsx bench/torch_parity.ts`) it loads Vela's weights, batch, noise and
time from DIR and compares the velocity and the gradients with Vela's (see parity()).

With --sample-serve (run by bench/infer.ts) it times sampling instead: the prefix's keys/values once,
then 10 Euler steps, on Vela's weights for the small presets and on the contract init of
scripts/real_pi/reference.py's tiny pi0 / pi0.5 (see sample_serve()).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

PRESETS = {
    "flow05-tiny": dict(image_size=96, patch=16, slots=3, width=128, depth=4, heads=4, head_dim=32, mlp=512,
                      max_token_len=48, state_dim=32, action_dim=32, horizon=16, params=2_202_272),
    "flow05-small": dict(image_size=224, patch=16, slots=3, width=384, depth=8, heads=6, head_dim=64, mlp=1536,
                       max_token_len=48, state_dim=32, action_dim=32, horizon=50, params=36_408_992),
    "flow0-tiny": dict(image_size=96, patch=16, slots=3, width=128, depth=4, heads=4, head_dim=32, mlp=512,
                     max_token_len=48, state_dim=32, action_dim=32, horizon=16, params=1_790_752),
    "flow0-small": dict(image_size=224, patch=16, slots=3, width=384, depth=8, heads=6, head_dim=64, mlp=1536,
                      max_token_len=48, state_dim=32, action_dim=32, horizon=50, params=29_368_352),
}


class Linear(torch.nn.Module):
    """y = x W + b, W [in, out] uniform +-1/sqrt(in), b = 0 (D1); zero=True for the adaptive-norm Linear (D3)."""

    def __init__(self, n_in, n_out, zero=False):
        super().__init__()
        bound = 1 / math.sqrt(n_in)
        w = torch.zeros(n_in, n_out) if zero else torch.empty(n_in, n_out).uniform_(-bound, bound)
        self.weight = torch.nn.Parameter(w)
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


def normal(*shape):
    return torch.nn.Parameter(torch.randn(*shape) * 0.02)  # D10


def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # D3


class Block(torch.nn.Module):
    """One expert's weights in one layer: norms (or adaptive-norm Linears), QKV, O, MLP."""

    def __init__(self, c, ada):
        super().__init__()
        w, d = c["width"], c["heads"] * c["head_dim"]
        self.ada = ada
        if ada:
            self.ada1 = Linear(w, 3 * w, zero=True)
            self.ada2 = Linear(w, 3 * w, zero=True)
        else:
            self.norm1 = torch.nn.Parameter(torch.ones(w))
            self.norm2 = torch.nn.Parameter(torch.ones(w))
        self.qkv = Linear(w, 3 * d)
        self.o = Linear(d, w)
        self.mlp1 = Linear(w, c["mlp"])
        self.mlp2 = Linear(c["mlp"], w)

    def mlp(self, h):
        return self.mlp2(F.gelu(self.mlp1(h), approximate="tanh"))


class Policy(torch.nn.Module):
    """What pi0 and pi0.5 share: the time embedding's periods, attention on split heads, the image and
    prompt embeddings and the prefix expert's pass that leaves its keys/values in a cache."""

    def init_common(self, c):
        """The time embedding's periods and the image and prompt embeddings' parameters (first, in
        both variants, so that a seed gives the same initial values as before pi0 was added)."""
        self.c = c
        w = c["width"]
        self.grid = c["image_size"] // c["patch"]
        self.patch_dim = c["patch"] ** 2 * 3
        frac = torch.linspace(0, 1, w // 2, dtype=torch.float64)
        self.register_buffer("period", 4e-3 * (4.0 / 4e-3) ** frac)  # float64, as Vela's timeEmbedding
        self.img_patch = Linear(self.patch_dim, w)
        self.img_pos = normal(self.grid ** 2, w)
        self.img_slot = normal(c["slots"], w)
        self.txt_embed = normal(257, w)  # D5
        self.txt_pos = normal(c["max_token_len"], w)

    def heads(self, x):  # [b, n, h*hd] -> [b, h, n, hd]
        b, n, _ = x.shape
        return x.view(b, n, self.c["heads"], self.c["head_dim"]).transpose(1, 2)

    def attend(self, q, k, v, bias):  # softmax(q k^T / sqrt(hd) + bias) v (D9), heads merged back
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.c["head_dim"]) + bias, dim=-1) @ v
        b, h, n, hd = att.shape
        return att.transpose(1, 2).reshape(b, n, h * hd)

    def time_embedding(self, t):
        """[b] -> [b, w] (MODEL.md "Time embedding"), computed in float64 and rounded, as Vela does in JS:
        the argument reaches 2 pi / 4e-3 ~ 1571 rad, where float32's rounding alone moves sin by ~1e-4."""
        arg = 2 * math.pi * t.double()[:, None] / self.period
        return torch.cat([torch.sin(arg), torch.cos(arg)], 1).float()

    def embed_prefix(self, patches, slots, tokens):
        """Image patch tokens [b, ns * pp, w] (patch linear + per-patch position + per-slot, D7) and prompt
        tokens [b, L, w] (D5)."""
        b, ns, pp, _ = patches.shape
        img = self.img_patch(patches) + self.img_pos[None, None] + self.img_slot[slots][None, :, None]
        return img.reshape(b, ns * pp, self.c["width"]), self.txt_embed[tokens] + self.txt_pos[None]

    def encode_prefix(self, x, valid):
        """The prefix expert over every layer: x [b, p, w], valid [b, p] bool. Returns the per-layer
        (keys, values) [b, h, p, hd] and the key bias [b, 1, 1, p] (0 valid, -1e9 padding)."""
        key_bias = torch.where(valid, 0.0, -1e9)[:, None, None, :]
        d = self.c["heads"] * self.c["head_dim"]
        cache = []
        for li, blk in enumerate(self.prefix):
            q, k, v = blk.qkv(rms(x) * blk.norm1).split(d, -1)
            cache.append((self.heads(k), self.heads(v)))
            if li == self.c["depth"] - 1:
                break  # the last prefix layer's output feeds nothing: only its keys and values
            x = x + blk.o(self.attend(self.heads(q), self.heads(k), self.heads(v), key_bias))
            x = x + blk.mlp(rms(x) * blk.norm2)
        return cache, key_bias


class Pi05(Policy):
    def __init__(self, c):
        super().__init__()
        w = c["width"]
        self.init_common(c)
        self.state_embed = normal(256, w)  # D6
        self.state_dim_emb = normal(c["state_dim"], w)
        self.act_in = Linear(c["action_dim"], w)
        self.act_pos = normal(c["horizon"], w)
        self.time_mlp1 = Linear(w, w)
        self.time_mlp2 = Linear(w, w)
        self.prefix = torch.nn.ModuleList([Block(c, False) for _ in range(c["depth"])])
        self.action = torch.nn.ModuleList([Block(c, True) for _ in range(c["depth"])])
        self.final_norm = torch.nn.Parameter(torch.ones(w))
        self.act_out = Linear(w, c["action_dim"])

    def forward(self, patches, slots, tokens, token_valid, bins, x_t, t):
        """patches [b, ns, pp, patch_dim] float in [-1, 1]; slots [ns] slot ids; tokens [b, L]; token_valid
        [b, L] bool; bins [b, s]; x_t [b, ah, ad]; t [b]. Returns the velocity [b, ah, ad]."""
        return self.velocity_cached(self.prefix_context(patches, slots, tokens, token_valid, bins), bins, x_t, t)

    def prefix_context(self, patches, slots, tokens, token_valid, bins):
        """The prefix's per-layer keys/values and key bias (encode_prefix), once per sample call."""
        c = self.c
        b, ns, pp, _ = patches.shape
        img, txt = self.embed_prefix(patches, slots, tokens)
        st = self.state_embed[bins] + self.state_dim_emb[None]
        x = torch.cat([img, txt, st], 1)  # [b, p, w] (D8 order)
        valid = torch.cat([torch.ones(b, ns * pp, dtype=torch.bool), token_valid, torch.ones(b, c["state_dim"], dtype=torch.bool)], 1)
        return self.encode_prefix(x, valid)

    def velocity_cached(self, ctx, bins, x_t, t):
        """The velocity [b, ah, ad] of the action tokens against a prefix_context."""
        c = self.c
        cache, key_bias = ctx
        b = x_t.shape[0]
        d = c["heads"] * c["head_dim"]
        cond = F.silu(self.time_mlp2(F.silu(self.time_mlp1(self.time_embedding(t)))))  # [b, w]
        y = self.act_in(x_t) + self.act_pos[None]  # [b, ah, w]
        h = c["horizon"]
        bias = torch.cat([key_bias.expand(b, 1, h, key_bias.shape[-1]), torch.zeros(b, 1, h, h)], 3)
        for blk, (pk, pv) in zip(self.action, cache):
            scale, shift, gate = blk.ada1(cond)[:, None].chunk(3, -1)
            hq, hk, hv = blk.qkv(rms(y) * (1 + scale) + shift).split(d, -1)
            k = torch.cat([pk, self.heads(hk)], 2)
            v = torch.cat([pv, self.heads(hv)], 2)
            y = y + blk.o(self.attend(self.heads(hq), k, v, bias)) * gate
            scale, shift, gate = blk.ada2(cond)[:, None].chunk(3, -1)
            y = y + blk.mlp(rms(y) * (1 + scale) + shift) * gate
        return self.act_out(rms(y) * self.final_norm)


class Pi0(Policy):
    """pi0 (MODEL.md, kernels/small/model.ts's pi0 variant): no state bins in the prefix; the normalised state
    is one suffix token, Linear(state_dim, w) with no position embedding (D7), ahead of the action tokens
    (D8); it sees the prefix and itself, the action tokens see the prefix, the state token and each
    other. Time: the action embedding (Linear(action_dim, w) + horizon embedding) concatenated with
    the sine-cosine time embedding, then Linear(2w, w), swish, Linear(w, w). The action expert has
    plain RMSNorms with weights (no adaptive norm); the final norm and head read the action tokens."""

    def __init__(self, c):
        super().__init__()
        w = c["width"]
        self.init_common(c)
        self.state_proj = Linear(c["state_dim"], w)
        self.act_in = Linear(c["action_dim"], w)
        self.act_pos = normal(c["horizon"], w)
        self.act_time1 = Linear(2 * w, w)
        self.act_time2 = Linear(w, w)
        self.prefix = torch.nn.ModuleList([Block(c, False) for _ in range(c["depth"])])
        self.action = torch.nn.ModuleList([Block(c, False) for _ in range(c["depth"])])
        self.final_norm = torch.nn.Parameter(torch.ones(w))
        self.act_out = Linear(w, c["action_dim"])

    def forward(self, patches, slots, tokens, token_valid, state, x_t, t):
        """patches [b, ns, pp, patch_dim] float in [-1, 1]; slots [ns] slot ids; tokens [b, L]; token_valid
        [b, L] bool; state [b, state_dim] normalised, zero-padded; x_t [b, ah, ad]; t [b]. Returns the
        velocity [b, ah, ad]."""
        return self.velocity_cached(self.prefix_context(patches, slots, tokens, token_valid, state), state, x_t, t)

    def prefix_context(self, patches, slots, tokens, token_valid, state):
        """The prefix's per-layer keys/values and key bias (the state is a suffix token: unused here)."""
        b, ns, pp, _ = patches.shape
        img, txt = self.embed_prefix(patches, slots, tokens)
        x = torch.cat([img, txt], 1)  # [b, p, w]
        valid = torch.cat([torch.ones(b, ns * pp, dtype=torch.bool), token_valid], 1)
        return self.encode_prefix(x, valid)

    def velocity_cached(self, ctx, state, x_t, t):
        """The velocity [b, ah, ad] of the state and action tokens against a prefix_context."""
        c = self.c
        cache, key_bias = ctx
        b = x_t.shape[0]
        d = c["heads"] * c["head_dim"]
        h = c["horizon"]
        act = self.act_in(x_t) + self.act_pos[None]  # [b, ah, w]
        temb = self.time_embedding(t)[:, None].expand(b, h, c["width"])
        act = self.act_time2(F.silu(self.act_time1(torch.cat([act, temb], 2))))
        y = torch.cat([self.state_proj(state)[:, None], act], 1)  # [b, 1 + ah, w]
        ts = h + 1
        suffix_bias = torch.zeros(ts, ts)
        suffix_bias[0, 1:] = -1e9  # the state token sees only itself among the suffix
        bias = torch.cat([key_bias.expand(b, 1, ts, key_bias.shape[-1]), suffix_bias.expand(b, 1, ts, ts)], 3)
        for blk, (pk, pv) in zip(self.action, cache):
            hq, hk, hv = blk.qkv(rms(y) * blk.norm1).split(d, -1)
            k = torch.cat([pk, self.heads(hk)], 2)
            v = torch.cat([pv, self.heads(hv)], 2)
            y = y + blk.o(self.attend(self.heads(hq), k, v, bias))
            y = y + blk.mlp(rms(y) * blk.norm2)
        return self.act_out(rms(y[:, 1:]) * self.final_norm)


def build(preset):
    """The torch model of a preset, its parameter count checked against MODEL.md's (SystemExit if not)."""
    c = PRESETS[preset]
    model = (Pi0 if preset.startswith(("flow0-", "pi0-")) else Pi05)(c)  # pi0-*: the names before issue 23
    params = sum(q.numel() for q in model.parameters())
    if params != c["params"]:
        raise SystemExit(f"{preset} has {params} parameters here; MODEL.md says {c['params']}")
    return model


def make_inputs(c, batch, cameras, gen):
    s, p = c["image_size"], c["patch"]
    images = torch.randint(0, 256, (batch, cameras, s, s, 3), dtype=torch.uint8, generator=gen)
    tokens = torch.randint(0, 256, (batch, c["max_token_len"]), generator=gen)
    token_valid = torch.arange(c["max_token_len"])[None].expand(batch, -1) < 40
    tokens = torch.where(token_valid, tokens, torch.full_like(tokens, 256))
    state = torch.rand(batch, c["state_dim"], generator=gen) * 2 - 1
    actions = torch.randn(batch, c["horizon"], c["action_dim"], generator=gen)
    mask = torch.ones_like(actions)
    return images, tokens, token_valid, state, actions, mask


def train_step(model, opt, c, inputs, gen):
    """One Vela training step: patchify + scale (D7, D12), bins (D6), noise then Beta(1.5, 1) time (D11),
    masked MSE per datum, weighted sum, backward, gradients / sum of weights, global norm, AdamW."""
    images, tokens, token_valid, state, actions, mask = inputs
    b, ns, s = images.shape[0], images.shape[1], c["image_size"]
    p, g = c["patch"], c["image_size"] // c["patch"]
    x = images.float() / 127.5 - 1
    patches = x.view(b, ns, g, p, g, p, 3).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, ns, g * g, p * p * 3)
    bins = ((state.clamp(-1, 1) + 1) / 2 * 256).floor().clamp(0, 255).long()
    st = state if isinstance(model, Pi0) else bins  # pi0 takes the state itself (one suffix token)
    noise = torch.randn(actions.shape, generator=gen)
    t = 0.999 * torch.rand(b, generator=gen).pow(2 / 3) + 0.001
    x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
    v = model(patches, torch.arange(ns), tokens, token_valid, st, x_t, t)
    per = ((v - (noise - actions)) ** 2 * mask).sum((1, 2)) / mask.sum((1, 2)).clamp(min=1)
    weight = torch.ones(b)
    opt.zero_grad(set_to_none=True)
    (per * weight).sum().backward()
    den = weight.sum()
    for prm in model.parameters():
        if prm.grad is None:  # the last prefix layer's O and MLP: Vela steps them with a zero gradient too
            prm.grad = torch.zeros_like(prm)
        else:
            prm.grad.div_(den)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(q.grad) for q in model.parameters() if q.grad is not None]))
    opt.step()
    return per.detach(), float(norm)


def read_safetensors(path):
    """{name: numpy array} from a safetensors file (F32, I32, U8) and its __metadata__ (or {})."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": np.float32, "I32": np.int32, "U8": np.uint8}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtypes[t["dtype"]]).reshape(t["shape"])
    return out, header.get("__metadata__") or {}


def vela_name(name):
    """This module's parameter name -> Vela's (kernels/small/model.ts paramSpecs)."""
    parts = name.split(".")
    if parts[0] in ("prefix", "action"):
        rest = parts[2:]
        if rest[0] in ("norm1", "norm2"):
            rest = [rest[0], "weight"]
        return ".".join(["layers", parts[1], parts[0], *rest])
    top = {"img_patch": "img.patch", "img_pos": "img.pos", "img_slot": "img.slot", "txt_embed": "txt.embed",
           "txt_pos": "txt.pos", "state_embed": "state.embed", "state_dim_emb": "state.dim", "state_proj": "state.proj",
           "act_in": "act.in", "act_pos": "act.pos", "act_time1": "act.time1", "act_time2": "act.time2",
           "time_mlp1": "time.mlp1", "time_mlp2": "time.mlp2", "act_out": "act.out", "final_norm": "final_norm.weight"}
    return ".".join([top[parts[0]], *parts[1:]])


def parity(preset, d, tolerance):
    """bench/torch_parity.ts's check: Vela's weights, batch, noise and time from d; this model's velocity
    and gradient of sum_i w_i loss_i against Vela's. Prints one JSON line; exit status 1 over tolerance
    (the largest absolute difference relative to the tensor's largest absolute value)."""
    c = PRESETS[preset]
    torch.set_num_threads(1)
    model = build(preset)
    weights, _ = read_safetensors(os.path.join(d, "weights.safetensors"))
    inp, _ = read_safetensors(os.path.join(d, "inputs.safetensors"))
    vela, meta = read_safetensors(os.path.join(d, "vela.safetensors"))
    names = {n: vela_name(n) for n, _ in model.named_parameters()}
    if sorted(names.values()) != sorted(weights):
        raise SystemExit(f"parameter names differ: torch only {sorted(set(names.values()) - set(weights))[:5]}, Vela only {sorted(set(weights) - set(names.values()))[:5]}")
    with torch.no_grad():
        for n, q in model.named_parameters():
            q.copy_(torch.from_numpy(weights[names[n]].copy()))
    t = lambda k: torch.from_numpy(inp[k].copy())  # noqa: E731
    images, image_mask = t("images"), t("image_mask")
    slots = [k for k in range(c["slots"]) if bool(image_mask[:, k].any())]
    if not bool(image_mask[:, slots].all()):
        raise SystemExit("parity needs every active slot filled in every datum (this model has no per-datum image mask)")
    b, s, p, g = images.shape[0], c["image_size"], c["patch"], c["image_size"] // c["patch"]
    x = images[:, slots].float() / 127.5 - 1
    patches = x.view(b, len(slots), g, p, g, p, 3).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, len(slots), g * g, p * p * 3)
    state = t("state")
    st = state if isinstance(model, Pi0) else ((state.clamp(-1, 1) + 1) / 2 * 256).floor().clamp(0, 255).long()
    noise, time_, actions, mask, weight = t("noise"), t("time"), t("actions"), t("action_mask"), t("weight")
    x_t = time_[:, None, None] * noise + (1 - time_[:, None, None]) * actions
    v = model(patches, torch.tensor(slots), t("tokens").long(), t("token_mask").bool(), st, x_t, time_)
    per = ((v - (noise - actions)) ** 2 * mask).sum((1, 2)) / mask.sum((1, 2)).clamp(min=1)
    (per * weight).sum().backward()

    def diff(ours, theirs):
        theirs = torch.from_numpy(theirs.copy())
        err = float((ours - theirs).abs().max())
        return err, err / max(float(theirs.abs().max()), 1e-30)

    v_err, v_rel = diff(v.detach(), vela["velocity"])
    l_err, l_rel = diff(per.detach(), vela["loss_per_datum"])
    worst, g_err, g_rel, compared, missing = None, 0.0, 0.0, 0, []
    for n, q in model.named_parameters():
        key = f"grad.{names[n]}"
        if key not in vela:  # Vela accumulates no gradient for a parameter that feeds nothing
            if q.grad is not None and float(q.grad.abs().max()) > 0:
                missing.append(names[n])
            continue
        if q.grad is None:
            missing.append(names[n])
            continue
        e, r = diff(q.grad, vela[key])
        compared += 1
        if r > g_rel:
            worst, g_err, g_rel = names[n], e, r
        g_err = max(g_err, e)
    out = {"preset": preset, "velocity_max_abs": v_err, "velocity_max_rel": v_rel, "velocity_scale": float(v.detach().abs().max()),
           "loss_max_abs": l_err, "loss": [float(x) for x in per], "grad_max_abs": g_err, "grad_max_rel": g_rel,
           "grad_worst": worst, "grads_compared": compared, "missing": missing, "denominator": float(meta.get("denominator", "nan")),
           "tolerance": tolerance}
    print(json.dumps(out))
    if missing or max(v_rel, l_rel, g_rel) > tolerance:
        sys.exit(1)


def patchify(c, images):
    """uint8 frames [b, ns, S, S, 3] -> patches [b, ns, g * g, p * p * 3] in [-1, 1] (D7, D12)."""
    b, ns = images.shape[:2]
    p, g = c["patch"], c["image_size"] // c["patch"]
    x = images.float() / 127.5 - 1
    return x.view(b, ns, g, p, g, p, 3).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, ns, g * g, p * p * 3)


@torch.no_grad()
def sample_small(model, c, images, tokens, token_valid, state, noise, num_steps=10):
    """Vela's cached sampler (MODEL.md "Sampling") on this model: the prefix's keys/values once, then
    `num_steps` Euler steps of the action tokens. images uint8 [b, ns, S, S, 3] (slots 0..ns-1 filled),
    tokens [b, L], token_valid [b, L] bool, state [b, sd] float, noise [b, ah, ad]. t starts at 1 and
    moves by dt in float32 while t >= -dt / 2, as kernels/flow.ts eulerSample. Returns x [b, ah, ad]."""
    ns = images.shape[1]
    st = state if isinstance(model, Pi0) else ((state.clamp(-1, 1) + 1) / 2 * 256).floor().clamp(0, 255).long()
    ctx = model.prefix_context(patchify(c, images), torch.arange(ns), tokens, token_valid, st)
    dt = np.float32(-1.0 / num_steps)
    t = np.float32(1.0)
    x = noise
    while t >= -dt / 2:
        v = model.velocity_cached(ctx, st, x, torch.full((x.shape[0],), float(t)))
        x = x + v * float(dt)
        t = np.float32(t + dt)
    return x


def load_real(variant):
    """scripts/real_pi/reference.py's tiny pi0 / pi0.5 with the contract's deterministic init (the same
    values as Vela's createRealPiParams(config, 'contract-init'))."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "real_pi"))
    import reference as R  # noqa: E402 (torch and numpy only)
    model = R.RealPi({"pi0": R.REAL_PI_TINY_PI0, "pi05": R.REAL_PI_TINY_PI05}[variant])
    R.init_params(model)
    return model.eval()


def sample_serve(threads):
    """--sample-serve: times sample() on request for bench/infer.ts. stdin lines:
    {"load": ID, "preset": P, "dir": D}: a small preset with Vela's weights (D/weights.safetensors) and
      D/inputs.safetensors (images U8 [1, 1, S, S, 3], tokens I32 [1, L], token_mask U8 [1, L], state F32
      [1, sd], noise F32 [1, ah, ad]);
    {"load": ID, "real": "pi0" | "pi05", "dir": D}: the real architecture's tiny config, contract init;
      inputs images F32 [1, 1, 3, S, S] in [-1, 1], tokens, token_mask, state F32 [1, 32], noise;
    each answered {"load": ID, "params": N, "actions": [...]} (batch 1, one camera, 10 steps);
    {"time": ID, "batch": B, "cameras": C, "n": N}: the loaded inputs repeated to B datums and C
    cameras, N samples timed (input tensors to actions, prefix once, 10 Euler steps) ->
    {"time": ID, "ms": [...]}."""
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    print(json.dumps({"torch_version": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    models = {}
    for line in iter(input_line, None):
        req = json.loads(line)
        if "load" in req:
            inp, _ = read_safetensors(os.path.join(req["dir"], "inputs.safetensors"))
            t = {k: torch.from_numpy(v.copy()) for k, v in inp.items()}
            if "real" in req:
                model = load_real(req["real"])

                def run(b, cams, model=model, t=t):
                    img = t["images"].expand(b, cams, -1, -1, -1).contiguous()
                    rep = lambda x: x.expand(b, *x.shape[1:]).contiguous()  # noqa: E731
                    return model.model.sample(img, torch.ones(b, cams, dtype=torch.int32), rep(t["tokens"]), rep(t["token_mask"]).int(), rep(t["state"]), rep(t["noise"]))
            else:
                preset = req["preset"]
                c = PRESETS[preset]
                model = build(preset)
                weights, _ = read_safetensors(os.path.join(req["dir"], "weights.safetensors"))
                with torch.no_grad():
                    for n, q in model.named_parameters():
                        q.copy_(torch.from_numpy(weights[vela_name(n)].copy()))
                model.eval()

                def run(b, cams, model=model, t=t, c=c):
                    rep = lambda x: x.expand(b, *x.shape[1:]).contiguous()  # noqa: E731
                    img = t["images"].expand(b, cams, -1, -1, -1).contiguous()
                    return sample_small(model, c, img, rep(t["tokens"]).long(), rep(t["token_mask"]).bool(), rep(t["state"]), rep(t["noise"]))
            with torch.inference_mode():
                actions = run(1, 1)
            models[req["load"]] = run
            params = sum(q.numel() for q in model.parameters())
            print(json.dumps({"load": req["load"], "params": params, "actions": actions.flatten().tolist()}), flush=True)
        else:
            run, times = models[req["time"]], []
            with torch.inference_mode():
                for _ in range(req["n"]):
                    t0 = time.perf_counter()
                    run(req["batch"], req["cameras"])
                    times.append((time.perf_counter() - t0) * 1000)
            print(json.dumps({"time": req["time"], "ms": times}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="flow05-tiny", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cameras", type=int, default=1)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--burn-in", type=int, default=3)
    ap.add_argument("--count-only", action="store_true", help="print the parameter count and exit")
    ap.add_argument("--serve", action="store_true", help="time steps on request from stdin (see above)")
    ap.add_argument("--parity", metavar="DIR", help="compare with Vela's forward and gradients written by bench/torch_parity.ts")
    ap.add_argument("--tolerance", type=float, default=1e-5, help="--parity: largest relative difference accepted")
    ap.add_argument("--sample-serve", action="store_true", help="time sample() on request from stdin (see sample_serve)")
    args = ap.parse_args()
    if args.sample_serve:
        return sample_serve(int(args.threads))
    if args.parity:
        return parity(args.preset, args.parity, args.tolerance)
    c = PRESETS[args.preset]
    torch.manual_seed(0)
    model = build(args.preset)
    params = sum(q.numel() for q in model.parameters())
    out = {"torch_version": torch.__version__, "preset": args.preset, "params": params, "rows": []}
    if args.count_only:
        print(json.dumps(out))
        return
    torch.set_num_interop_threads(1)
    runs = {}
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        model = build(args.preset)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        gen = torch.Generator().manual_seed(0)
        runs[threads] = (model, opt, gen, make_inputs(c, args.batch, args.cameras, gen))
        timed(c, runs[threads], args.burn_in)

    if args.serve:
        print(json.dumps(out), flush=True)
        for line in iter(input_line, None):
            req = json.loads(line)
            torch.set_num_threads(req["threads"])
            print(json.dumps({"threads": req["threads"], "step_ms": timed(c, runs[req["threads"]], req["steps"])}), flush=True)
        return
    for threads, run in runs.items():
        torch.set_num_threads(threads)
        out["rows"].append({"threads": threads, "batch": args.batch, "cameras": args.cameras, "step_ms": timed(c, run, args.steps)})
    print(json.dumps(out))


def timed(c, run, steps):
    """Runs `steps` training steps; returns each one's wall time in ms."""
    model, opt, gen, inputs = run
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        per, _ = train_step(model, opt, c, inputs, gen)
        per.sum().item()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def input_line():
    """The next non-empty stdin line, or None at end of input."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return None
        if line.strip():
            return line

if __name__ == "__main__":
    main()
