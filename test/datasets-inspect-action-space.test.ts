/**
 * `vela datasets inspect` explains its action space as `vela policy` does (issue 35, item 11b):
 * run as the real CLI on the LeRobot fixtures, it says why the default is what it is, what a
 * fine-tune learns in it, and what the policy then answers, in the words of `vela policy`'s
 * start-up line (answeredAs, which that line prints).
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { answeredAs } from '../server/datasets/actions.ts';

const ROOT = path.resolve(import.meta.dirname, '..');

async function inspect(fixture: string): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [path.join(ROOT, 'bin/vela.js'), 'datasets', 'inspect', path.join(ROOT, 'test/fixtures', fixture)], { cwd: ROOT, timeout: 120_000 });
  return stdout;
}

describe('vela datasets inspect: the action space explained', () => {
  it('delta (names match): learns action - state, answers absolute with the state added back', async () => {
    const text = await inspect('lerobot_v30');
    expect(answeredAs('delta')).toBe('absolute (trained as deltas; the state is added back)');
    expect(text).toContain(
      'action space default: delta (every action dim is named like a state dim)\n' +
        '  a fine-tune learns action - state on the 3 shared dims (x, y, gripper); its policy (vela policy) answers actions absolute (trained as deltas; the state is added back)\n' +
        '  (--action-space absolute learns the actions as they are)\n',
    );
  }, 120_000);

  it('absolute (names differ): says why, what it learns, and what --action-space delta would do', async () => {
    const text = await inspect('lerobot_image');
    expect(text).toContain(
      'action space default: absolute (the names differ: 2 of 3 action dims are named like state dims)\n' +
        '  a fine-tune learns the actions as they are; its policy (vela policy) answers actions absolute\n' +
        '  (--action-space delta would learn action - state on the 2 shared dims (a, b); its policy then answers actions absolute (trained as deltas; the state is added back))\n',
    );
    const wide = await inspect('lerobot_wide');
    expect(wide).toContain('action space default: absolute (no action dim is named like a state dim)\n  a fine-tune learns the actions as they are; its policy (vela policy) answers actions absolute\n');
    expect(wide).not.toContain('--action-space delta');
  }, 120_000);
});
