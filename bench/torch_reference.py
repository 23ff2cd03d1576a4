"""PyTorch reference of Vela's pi0.5 policy (shared/spec/MODEL.md), for the bench's speed ratio.

Builds `pi05-tiny` (or pi05-small) exactly as MODEL.md and kernels/policy.ts describe it: the same
parameter table (2,202,272 parameters for pi05-tiny, checked), the same token layout (only the
image slots that hold a frame are computed, D13), the same last prefix layer that computes only
keys and values, adaptive RMSNorm in the action expert, GELU (tanh), masked MSE flow-matching loss
per datum, then AdamW (torch.optim.AdamW, betas 0.9 / 0.95, eps 1e-12, no weight decay) after the
global gradient norm, as Vela's optim_step. It times that training step on the CPU.

    python3 bench/torch_reference.py --batch 8 --cameras 1 --threads 1,2 --steps 20

Prints one JSON object on stdout: {"torch_version", "params", "rows": [{"threads", "batch",
"cameras", "step_ms": [...]}]}. Needs torch (CPU is enough); nothing else of the project.

With --serve it builds one model per thread count, runs the burn-in steps, prints the JSON object
with empty rows, then times steps on request: each stdin line {"threads": T, "steps": N} is
answered by one stdout line {"threads": T, "step_ms": [...]}. The bench uses this to interleave
PyTorch steps with Vela's, so a shared machine's changing load falls on both alike.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

PRESETS = {
    "pi05-tiny": dict(image_size=96, patch=16, slots=3, width=128, depth=4, heads=4, head_dim=32, mlp=512,
                      max_token_len=48, state_dim=32, action_dim=32, horizon=16, params=2_202_272),
    "pi05-small": dict(image_size=224, patch=16, slots=3, width=384, depth=8, heads=6, head_dim=64, mlp=1536,
                       max_token_len=48, state_dim=32, action_dim=32, horizon=50, params=36_408_992),
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


class Pi05(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        w = c["width"]
        self.grid = c["image_size"] // c["patch"]
        self.patch_dim = c["patch"] ** 2 * 3
        self.img_patch = Linear(self.patch_dim, w)
        self.img_pos = normal(self.grid ** 2, w)
        self.img_slot = normal(c["slots"], w)
        self.txt_embed = normal(257, w)  # D5
        self.txt_pos = normal(c["max_token_len"], w)
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
        half = w // 2
        frac = torch.linspace(0, 1, half, dtype=torch.float64)
        self.register_buffer("period", (4e-3 * (4.0 / 4e-3) ** frac).float())

    def heads(self, x):  # [b, n, h*hd] -> [b, h, n, hd]
        b, n, _ = x.shape
        return x.view(b, n, self.c["heads"], self.c["head_dim"]).transpose(1, 2)

    def attend(self, q, k, v, bias):  # softmax(q k^T / sqrt(hd) + bias) v (D9), heads merged back
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.c["head_dim"]) + bias, dim=-1) @ v
        b, h, n, hd = att.shape
        return att.transpose(1, 2).reshape(b, n, h * hd)

    def forward(self, patches, slots, tokens, token_valid, bins, x_t, t):
        """patches [b, ns, pp, patch_dim] float in [-1, 1]; slots [ns] slot ids; tokens [b, L]; token_valid
        [b, L] bool; bins [b, s]; x_t [b, ah, ad]; t [b]. Returns the velocity [b, ah, ad]."""
        c = self.c
        b, ns, pp, _ = patches.shape
        w = c["width"]
        img = self.img_patch(patches) + self.img_pos[None, None] + self.img_slot[slots][None, :, None]
        txt = self.txt_embed[tokens] + self.txt_pos[None]
        st = self.state_embed[bins] + self.state_dim_emb[None]
        x = torch.cat([img.reshape(b, ns * pp, w), txt, st], 1)  # [b, p, w] (D8 order)
        valid = torch.cat([torch.ones(b, ns * pp, dtype=torch.bool), token_valid, torch.ones(b, c["state_dim"], dtype=torch.bool)], 1)
        key_bias = torch.where(valid, 0.0, -1e9)[:, None, None, :]  # [b, 1, 1, p]
        d = c["heads"] * c["head_dim"]
        cache = []
        for li, blk in enumerate(self.prefix):
            q, k, v = blk.qkv(rms(x) * blk.norm1).split(d, -1)
            cache.append((self.heads(k), self.heads(v)))
            if li == c["depth"] - 1:
                break  # the last prefix layer's output feeds nothing: only its keys and values
            x = x + blk.o(self.attend(self.heads(q), self.heads(k), self.heads(v), key_bias))
            x = x + blk.mlp(rms(x) * blk.norm2)
        temb = torch.cat([torch.sin(2 * math.pi * t[:, None] / self.period), torch.cos(2 * math.pi * t[:, None] / self.period)], 1)
        cond = F.silu(self.time_mlp2(F.silu(self.time_mlp1(temb))))  # [b, w]
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
    noise = torch.randn(actions.shape, generator=gen)
    t = 0.999 * torch.rand(b, generator=gen).pow(2 / 3) + 0.001
    x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
    v = model(patches, torch.arange(ns), tokens, token_valid, bins, x_t, t)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="pi05-tiny", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cameras", type=int, default=1)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--burn-in", type=int, default=3)
    ap.add_argument("--count-only", action="store_true", help="print the parameter count and exit")
    ap.add_argument("--serve", action="store_true", help="time steps on request from stdin (see above)")
    args = ap.parse_args()
    c = PRESETS[args.preset]
    torch.manual_seed(0)
    model = Pi05(c)
    params = sum(q.numel() for q in model.parameters())
    if params != c["params"]:
        raise SystemExit(f"{args.preset} has {params} parameters here; MODEL.md says {c['params']}")
    out = {"torch_version": torch.__version__, "preset": args.preset, "params": params, "rows": []}
    if args.count_only:
        print(json.dumps(out))
        return
    torch.set_num_interop_threads(1)
    runs = {}
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        model = Pi05(c)
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
