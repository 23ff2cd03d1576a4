"""Fine-tunes bench/torch_reference.py's model (the same pi0 / pi0.5 architecture as Vela's preset) on
the G1 data that `npx tsx bench/recipe.ts --torch` exports, the way Vela's job trains, and writes its
sampled chunks for the held-out frames; recipe.ts scores them with Vela's own scorer.

    python3 bench/torch_finetune.py --data DIR --steps 1500 --batch-size 16 --learning-rate 1e-4
    python3 bench/torch_finetune.py --data DIR --preset flow0-tiny --batch-size 32 --learning-rate 3e-4 --ema-decay 0.99

The export (DIR/meta.json, frames.u8 [N, S, S, 3], state.f32 [N, sd], action.f32 [N, ad]) holds
every frame of the dataset at the model's image size (Vela's own resize), the prompt's tokens, the
training episodes, the held-out (episode, frame) list and the norm stats Vela computes for the
run (delta chunk entries). The training is Vela's (server/jobs/train.ts): frames drawn
uniformly with replacement from the training episodes, 16-step chunks padded and masked past an
episode's end, delta actions on the shared dims, normalisation as Vela's normalizerFor(preset)
(kernels/normalize.ts: z-score `(x - mean) / (std + 1e-6)` for pi0, quantile for pi0.5) of the
state and the actions, the state as pi0's suffix token or pi0.5's bins, noise then Beta(1.5, 1)
time (D11), masked MSE, global-norm clipping at 1, AdamW (betas 0.9 / 0.95), linear warm-up then
cosine to a floor, an optional moving average of the weights with the same warm-up. Sampling:
10 Euler steps from seeded noise. Writes DIR/<out>.f32: [M, horizon, action_dim] normalised
chunks, M = len(meta["eval"]), and prints one JSON line of timings.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_reference import PRESETS, build  # noqa: E402  (the same directory)


def quantile_norm(x, st):
    """pi0.5: (x - q01) / (q99 - q01 + 1e-6) * 2 - 1 (kernels/normalize.ts quantileNormalize)."""
    q01, q99 = np.asarray(st["q01"], np.float32), np.asarray(st["q99"], np.float32)
    return (x - q01[: x.shape[-1]]) / (q99[: x.shape[-1]] - q01[: x.shape[-1]] + 1e-6) * 2 - 1


def zscore_norm(x, st):
    """pi0: (x - mean) / (std + 1e-6) (kernels/normalize.ts zscore)."""
    mean, std = np.asarray(st["mean"], np.float32), np.asarray(st["std"], np.float32)
    return (x - mean[: x.shape[-1]]) / (std[: x.shape[-1]] + 1e-6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default="torch_pred")
    ap.add_argument("--preset", "--model", dest="preset", default="flow05-tiny", choices=sorted(PRESETS),
                    help="the model (--model is the same flag, as `vela finetune` names it); the export must be for it")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--warmup-steps", type=int, default=None)
    ap.add_argument("--lr-floor", type=float, default=0.1)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=1e-10)
    ap.add_argument("--ema-decay", type=float, default=0.0)
    ap.add_argument("--time-sampling", choices=["beta", "uniform"], default="beta")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    meta = json.load(open(os.path.join(args.data, "meta.json")))
    if meta["preset"] != args.preset:
        raise SystemExit(f"{args.data} was exported for {meta['preset']}; --preset is {args.preset} (export it for that preset: recipe.ts --export --model {args.preset})")
    c = PRESETS[args.preset]
    pi0 = args.preset.startswith(("flow0-", "pi0-"))  # pi0-* are the names before issue 23
    normalize = zscore_norm if pi0 else quantile_norm
    S, H, A, SD = c["image_size"], c["horizon"], c["action_dim"], c["state_dim"]
    ad, sd = meta["ad"], meta["sd"]
    frames = np.fromfile(os.path.join(args.data, "frames.u8"), np.uint8).reshape(-1, S, S, 3)
    state = np.fromfile(os.path.join(args.data, "state.f32"), np.float32).reshape(-1, sd)
    action = np.fromfile(os.path.join(args.data, "action.f32"), np.float32).reshape(-1, ad)
    episodes = {e["index"]: e for e in meta["episodes"]}
    pairs = meta["delta_pairs"]
    norm = meta["norm_stats"]
    state_n = np.zeros((len(state), SD), np.float32)
    state_n[:, :sd] = normalize(state, norm["state"])
    # pi0 takes the normalised state (one suffix token); pi0.5 its 256 bins (D6)
    state_in = torch.from_numpy(state_n) if pi0 else torch.from_numpy(np.clip(np.floor((np.clip(state_n, -1, 1) + 1) / 2 * 256), 0, 255).astype(np.int64))
    tokens = torch.tensor(meta["tokens"], dtype=torch.long)
    token_valid = torch.tensor(meta["token_mask"], dtype=torch.bool)

    def chunk(ep, t):
        """Normalised delta chunk [H, A] and mask [H, A] at frame t of episode ep (Vela's actionChunk)."""
        e = episodes[ep]
        rows = [e["offset"] + min(t + h, e["length"] - 1) for h in range(H)]
        a = action[rows].copy()
        for ai, si in pairs:
            a[:, ai] -= state[e["offset"] + t, si]
        out = np.zeros((H, A), np.float32)
        mask = np.zeros((H, A), np.float32)
        valid = min(H, e["length"] - t)
        out[:valid, :ad] = normalize(a[:valid], norm["actions"])
        mask[:valid, :ad] = 1
        return out, mask

    def inputs(items):
        rows = [episodes[ep]["offset"] + t for ep, t in items]
        b = len(rows)
        g, p = S // c["patch"], c["patch"]
        x = torch.from_numpy(frames[rows]).float() / 127.5 - 1
        patches = x.view(b, 1, g, p, g, p, 3).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, 1, g * g, p * p * 3)
        return patches, tokens[None].expand(b, -1), token_valid[None].expand(b, -1), state_in[rows]

    train_frames = [(ep, t) for ep in meta["train"] for t in range(episodes[ep]["length"])]
    model = build(args.preset)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.learning_rate, betas=(0.9, 0.95), eps=args.adam_eps, weight_decay=args.weight_decay)
    ema = [q.detach().clone() for q in params] if args.ema_decay > 0 else None
    warmup = args.warmup_steps if args.warmup_steps is not None else min(100, max(1, args.steps // 10))
    slot = torch.arange(1)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        if step <= warmup:
            lr = args.learning_rate * step / warmup
        else:
            progress = min(1.0, (step - warmup) / max(1, args.steps - warmup))
            lr = args.learning_rate * (args.lr_floor + (1 - args.lr_floor) * 0.5 * (1 + math.cos(math.pi * progress)))
        for g_ in opt.param_groups:
            g_["lr"] = lr
        picks = [train_frames[i] for i in rng.integers(0, len(train_frames), args.batch_size)]
        ch = [chunk(ep, t) for ep, t in picks]
        actions = torch.from_numpy(np.stack([a for a, _ in ch]))
        mask = torch.from_numpy(np.stack([m for _, m in ch]))
        patches, tok, tv, st = inputs(picks)
        noise = torch.randn(actions.shape)
        u = torch.rand(args.batch_size)
        tt = 0.999 * (u if args.time_sampling == "uniform" else u.pow(2 / 3)) + 0.001
        x_t = tt[:, None, None] * noise + (1 - tt[:, None, None]) * actions
        v = model(patches, slot, tok, tv, st, x_t, tt)
        per = ((v - (noise - actions)) ** 2 * mask).sum((1, 2)) / mask.sum((1, 2)).clamp(min=1)
        opt.zero_grad(set_to_none=True)
        (per.sum() / args.batch_size).backward()
        for q in params:
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if ema is not None:
            d = min(args.ema_decay, (step) / (9 + step))  # Vela's warm-up: (1 + n) / (10 + n), n = step - 1
            with torch.no_grad():
                for e, q in zip(ema, params):
                    e.mul_(d).add_(q.detach(), alpha=1 - d)
        if step % max(1, args.steps // 20) == 0:
            print(f"step {step}/{args.steps} loss {float(per.detach().mean()):.4f} lr {lr:.2e} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    train_s = time.time() - t0
    if ema is not None:
        with torch.no_grad():
            for e, q in zip(ema, params):
                q.copy_(e)

    # Held-out chunks: 10 Euler steps from seeded noise (t = 1 noise -> t = 0), as Vela samples.
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    out = []
    with torch.no_grad():
        items = [(e["episode"], e["t"]) for e in meta["eval"]]
        for s in range(0, len(items), 32):
            part = items[s:s + 32]
            patches, tok, tv, st = inputs(part)
            x = torch.randn((len(part), H, A), generator=gen)
            dt = -0.1
            t = 1.0
            while t >= -dt / 2:
                x = x + dt * model(patches, slot, tok, tv, st, x, torch.full((len(part),), t))
                t += dt
            out.append(x.numpy().astype(np.float32))
    np.concatenate(out).tofile(os.path.join(args.data, f"{args.out}.f32"))
    print(json.dumps({"train_s": train_s, "total_s": time.time() - t0, "steps": args.steps, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
