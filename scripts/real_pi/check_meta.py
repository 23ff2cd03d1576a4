"""Builds the reference (scripts/real_pi/reference.py) at FULL size on PyTorch's meta device (no
memory, no weights) and checks that its parameters have exactly the names and shapes of LeRobot's
runtime state dict (test/fixtures/real-pi/pi0_state_dict.json / pi05_state_dict.json, copies of
../shared/spec/real-pi/), minus the two LM heads, which the reference leaves out on purpose
(nothing reads them: pi0 decodes no text). Prints the parameter counts, which must equal FACTS
(pi0 3,238,048,528, pi0.5 3,353,433,872, used in a forward pass). Exits 1 on any difference.

Also checks the tiny presets against the LeRobot-style tiny build of FACTS 5.2
(../shared/spec/real-pi/tiny_reference_shapes.json, pi0.5, `paligemma_with_expert.` part), when
that file is present.

Run: python3 scripts/real_pi/check_meta.py   (needs torch)
"""
from __future__ import annotations

import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference as R  # noqa: E402

FIXTURES = os.path.join(HERE, '..', '..', 'test', 'fixtures', 'real-pi')
TINY_SHAPES = os.path.join(HERE, '..', '..', '..', 'shared', 'spec', 'real-pi', 'tiny_reference_shapes.json')
EXPECTED_COUNTS = {'pi0': 3_238_048_528, 'pi05': 3_353_433_872}


def compare(ours: dict[str, list[int]], theirs: dict[str, list[int]], label: str) -> list[str]:
    errs = [f'{label}: missing from the reference: {n} {s}' for n, s in theirs.items() if n not in ours]
    errs += [f'{label}: not in LeRobot\'s list: {n} {s}' for n, s in ours.items() if n not in theirs]
    errs += [f'{label}: {n} is {ours[n]} here, {s} in LeRobot' for n, s in theirs.items() if n in ours and ours[n] != s]
    return errs


def main() -> int:
    errs: list[str] = []
    for variant, cfg in (('pi0', R.REAL_PI0), ('pi05', R.REAL_PI05)):
        with torch.device('meta'):
            model = R.RealPi(cfg)
        ours = {n: list(p.shape) for n, p in model.named_parameters()}
        with open(os.path.join(FIXTURES, f'{variant}_state_dict.json')) as f:
            entries = json.load(f)
        theirs = {e[0]: list(e[1]) for e in entries}
        heads = {n: theirs.pop(n) for n in R.LM_HEAD_NAMES}
        errs += compare(ours, theirs, variant)
        n = R.count_params(model)
        n_heads = sum(math.prod(s) for s in heads.values())
        print(f'{variant}: {len(ours)} tensors, {n:,} parameters (FACTS: {EXPECTED_COUNTS[variant]:,}); '
              f'LeRobot list: {len(entries)} tensors = {len(theirs)} + the 2 LM heads ({n_heads:,} parameters, left out); '
              f'with them {n + n_heads:,}')
        if n != EXPECTED_COUNTS[variant]:
            errs.append(f'{variant}: {n:,} parameters; FACTS says {EXPECTED_COUNTS[variant]:,}')
    if os.path.exists(TINY_SHAPES):
        with open(TINY_SHAPES) as f:
            tiny = json.load(f)['lerobot_pi_gemma_tiny_pi05']
        theirs = {'model.' + e[0]: list(e[1]) for e in tiny if 'lm_head' not in e[0]}
        model = R.RealPi(R.REAL_PI_TINY_PI05)
        ours = {n: list(p.shape) for n, p in model.named_parameters() if n.startswith('model.paligemma_with_expert.')}
        errs += compare(ours, theirs, 'tiny pi05')
        print(f'tiny pi05 (paligemma_with_expert part): {len(ours)} tensors against {len(theirs)} of tiny_reference_shapes.json; '
              f'tiny totals: pi0 {R.count_params(R.RealPi(R.REAL_PI_TINY_PI0)):,}, pi05 {R.count_params(model):,}')
    for e in errs:
        print('ERROR', e)
    print('OK: names and shapes equal' if not errs else f'{len(errs)} differences')
    return 1 if errs else 0


if __name__ == '__main__':
    sys.exit(main())
