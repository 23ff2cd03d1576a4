"""Writes a random-weight pi0 / pi0.5 checkpoint in the Hugging Face Hub layout of `lerobot/pi0_base`
/ `lerobot/pi05_base` (FACTS 2.1-2.2), for the full-size load-and-sample benchmark (issue 23):

    OUT/config.json         LeRobot's policy config (PI0Config / PI05Config defaults)
    OUT/model.safetensors   the Hub key names (no `model.` prefix, SigLIP under `vision_model.`,
                            the token embedding stored only as `paligemma.lm_head.weight`, the
                            expert's unused `lm_head` present), float32 or bfloat16

Usage:
    python3 scripts/real_pi/write_random_checkpoint.py --variant pi05 --dtype bfloat16 --out DIR
    python3 scripts/real_pi/write_random_checkpoint.py --variant pi05 --dtype bfloat16 --out DIR --size tiny --check

Values: every tensor by the parity vectors' init rule (reference.init_values) under the runtime
parameter name it loads into (the embedding under `...embed_tokens.weight`, the unused expert head
under `model.paligemma_with_expert.gemma_expert.lm_head.weight`), so a loader's result can be
compared with the rule. bfloat16 rounds to nearest even.

Memory: streams tensor by tensor in chunks of 2^22 elements, so peak RSS stays ~0.5 GB (mostly
torch, imported to list the parameters) whatever the size; the file is written to
OUT/model.safetensors.tmp and renamed when complete. At full size the pi0.5 file is 7.2 GB
(bfloat16) / 14.5 GB (float32): 3.6 G values at ~10 M values/s on one core, i.e. ~6 minutes.

--size full checks the key list and shapes against test/fixtures/real-pi/<variant>_hub_checkpoint_keys.json
before writing. --size tiny (the parity config of FACTS 5.2) adds the field `vela_real_pi_config`
to config.json, since LeRobot's config can only name the full-size variants. --check reads the
file back: header keys, dtypes, shapes; and (tiny only) every value, mapped back to the runtime
names, against the rule.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference as R  # noqa: E402

FIXTURES = os.path.join(HERE, '..', '..', 'test', 'fixtures', 'real-pi')
CHUNK = 1 << 22
EXPERT_HEAD = 'model.paligemma_with_expert.gemma_expert.lm_head.weight'


def hub_key(name: str) -> str:
    """Runtime (LeRobot) parameter name -> key in the Hub's model.safetensors (FACTS 2.2)."""
    if name == R.EMBED_NAME:
        return 'paligemma_with_expert.paligemma.lm_head.weight'  # tied; only the head is stored
    key = name[len('model.'):]
    return key.replace('.vision_tower.', '.vision_tower.vision_model.')


def hub_layout(cfg: R.RealPiConfig) -> list[tuple[str, list[int], str]]:
    """(hub key, shape, runtime name whose init values it holds) for every tensor of the file."""
    import torch

    with torch.device('meta'):
        model = R.RealPi(cfg)
    out = [(hub_key(n), list(p.shape), n) for n, p in model.named_parameters()]
    out.append(('paligemma_with_expert.gemma_expert.lm_head.weight', [cfg.vlm.vocabSize, cfg.expert.width], EXPERT_HEAD))
    return out


def lerobot_config(cfg: R.RealPiConfig, dtype: str, tiny: bool) -> dict:
    """LeRobot's policy config.json fields with their dataclass defaults (FACTS 2.1)."""
    res = [3, cfg.vision.imageSize, cfg.vision.imageSize]
    conf = {
        'type': cfg.variant,
        'n_obs_steps': 1,
        'input_features': {
            **{f'observation.images.{cam}': {'type': 'VISUAL', 'shape': res} for cam in ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')},
            'observation.state': {'type': 'STATE', 'shape': [cfg.actionDim]},
        },
        'output_features': {'action': {'type': 'ACTION', 'shape': [cfg.actionDim]}},
        'paligemma_variant': 'gemma_2b',
        'action_expert_variant': 'gemma_300m',
        'dtype': dtype,
        'chunk_size': cfg.actionHorizon,
        'n_action_steps': cfg.actionHorizon,
        'max_state_dim': 32,
        'max_action_dim': cfg.actionDim,
        'num_inference_steps': cfg.numSteps,
        'time_sampling_beta_alpha': 1.5,
        'time_sampling_beta_beta': 1.0,
        'time_sampling_scale': 0.999,
        'time_sampling_offset': 0.001,
        'min_period': R.MIN_PERIOD,
        'max_period': R.MAX_PERIOD,
        'image_resolution': [cfg.vision.imageSize, cfg.vision.imageSize],
        'empty_cameras': 0,
        'tokenizer_max_length': cfg.maxTokenLen,
        'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD' if cfg.variant == 'pi0' else 'QUANTILES',
                                  'ACTION': 'MEAN_STD' if cfg.variant == 'pi0' else 'QUANTILES'},
    }
    if tiny:
        conf['vela_real_pi_config'] = cfg.to_json()
    return conf


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (no NaN in our data)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write(cfg: R.RealPiConfig, dtype: str, out: str, tiny: bool) -> str:
    layout = hub_layout(cfg)
    if not tiny:
        with open(os.path.join(FIXTURES, f'{cfg.variant}_hub_checkpoint_keys.json')) as f:
            want = {e[0]: list(e[1]) for e in json.load(f)}
        got = {k: s for k, s, _ in layout}
        if got != want:
            diff = sorted(set(got) ^ set(want)) + [k for k in got if k in want and got[k] != want[k]]
            raise SystemExit(f'Hub key list differs from {cfg.variant}_hub_checkpoint_keys.json: {diff[:10]}')
    st_dtype, width = {'float32': ('F32', 4), 'bfloat16': ('BF16', 2)}[dtype]
    header, off = {}, 0
    for key, shape, _ in layout:
        n = math.prod(shape) * width
        header[key] = {'dtype': st_dtype, 'shape': shape, 'data_offsets': [off, off + n]}
        off += n
    header['__metadata__'] = {'format': 'pt'}
    hb = json.dumps(header, separators=(',', ':')).encode()
    hb += b' ' * (-len(hb) % 8)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, 'model.safetensors')
    with open(path + '.tmp', 'wb') as f:
        f.write(len(hb).to_bytes(8, 'little'))
        f.write(hb)
        for _, shape, name in layout:
            n = math.prod(shape)
            for start in range(0, n, CHUNK):
                v = R.init_values(name, n, start, min(CHUNK, n - start))
                f.write((to_bf16_bits(v) if dtype == 'bfloat16' else v).tobytes())
    os.replace(path + '.tmp', path)
    with open(os.path.join(out, 'config.json.tmp'), 'w') as f:
        json.dump(lerobot_config(cfg, dtype, tiny), f, indent=2)
        f.write('\n')
    os.replace(os.path.join(out, 'config.json.tmp'), os.path.join(out, 'config.json'))
    return path


def check(cfg: R.RealPiConfig, dtype: str, path: str, tiny: bool) -> None:
    """Reads the file back: keys/dtypes/shapes, and for tiny every value against the rule."""
    from safetensors import safe_open

    layout = hub_layout(cfg)
    st_dtype = {'float32': 'F32', 'bfloat16': 'BF16'}[dtype]
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(n))
    header.pop('__metadata__', None)
    assert sorted(header) == sorted(k for k, _, _ in layout), 'key list'
    for key, shape, _ in layout:
        assert header[key]['shape'] == shape and header[key]['dtype'] == st_dtype, key
    print(f'check: {len(header)} tensors, {sum(math.prod(s) for _, s, _ in layout):,} values, dtype {st_dtype}, header OK')
    if not tiny:
        return
    import torch

    model = R.RealPi(cfg)
    R.init_params(model)
    want = dict(model.named_parameters())
    loaded = 0
    with safe_open(path, 'pt') as f:
        for key, shape, name in layout:
            t = f.get_tensor(key)
            ref = torch.from_numpy(R.init_values(name, math.prod(shape)).reshape(shape))
            if dtype == 'bfloat16':
                ref = ref.to(torch.bfloat16)
            assert torch.equal(t, ref), key
            if name in want:  # what a loader would put into the model
                assert torch.equal(t.float(), want[name].detach().to(t.dtype).float()), name
                loaded += 1
    print(f'check: every value equals the rule; {loaded} tensors map onto the model\'s {len(want)} parameters, 1 (the expert lm_head) left over')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--variant', choices=['pi0', 'pi05'], required=True)
    ap.add_argument('--dtype', choices=['float32', 'bfloat16'], default='bfloat16')
    ap.add_argument('--out', required=True, help='output folder (created)')
    ap.add_argument('--size', choices=['full', 'tiny'], default='full')
    ap.add_argument('--check', action='store_true', help='read the file back and verify it')
    ap.add_argument('--dry-run', action='store_true', help='check the key list (full size: against the fixture) and print the size; write nothing')
    a = ap.parse_args()
    tiny = a.size == 'tiny'
    cfg = {('pi0', 'full'): R.REAL_PI0, ('pi05', 'full'): R.REAL_PI05, ('pi0', 'tiny'): R.REAL_PI_TINY_PI0, ('pi05', 'tiny'): R.REAL_PI_TINY_PI05}[(a.variant, a.size)]
    if a.dry_run:
        layout = hub_layout(cfg)
        if not tiny:
            with open(os.path.join(FIXTURES, f'{cfg.variant}_hub_checkpoint_keys.json')) as f:
                want = {e[0]: list(e[1]) for e in json.load(f)}
            same = want == {k: s for k, s, _ in layout}
            print(f'key list {"equals" if same else "DIFFERS from"} {cfg.variant}_hub_checkpoint_keys.json')
            if not same:
                sys.exit(1)
        n = sum(math.prod(s) for _, s, _ in layout)
        print(f'{len(layout)} tensors, {n:,} values, {n * (2 if a.dtype == "bfloat16" else 4):,} bytes of data')
        return
    path = write(cfg, a.dtype, a.out, tiny)
    print(f'wrote {path}: {os.path.getsize(path):,} bytes')
    if a.check:
        check(cfg, a.dtype, path, tiny)


if __name__ == '__main__':
    main()
