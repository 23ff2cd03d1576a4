/** A plain-text summary of a dataset, printed by `vela datasets inspect DIR`. */
import { explainActionSpace } from './actions.ts';
import type { DatasetMeta } from './types.ts';

function names(list: string[] | null, max = 6): string {
  if (!list) return '(no names)';
  return list.length <= max ? list.join(', ') : `${list.slice(0, max).join(', ')}, ... (${list.length})`;
}

/**
 * Multi-line text: path, version, fps, episodes and frames (with min/mean/max length and
 * duration), tasks, cameras (short name, kind, size, codec), state and action dims with names,
 * and the default action space explained (what a fine-tune learns, what its policy answers).
 */
export function describeDataset(meta: DatasetMeta): string {
  const lengths = meta.episodes.map((e) => e.length);
  const minLen = Math.min(...lengths);
  const maxLen = Math.max(...lengths);
  const meanLen = meta.totalFrames / Math.max(1, lengths.length);
  const seconds = meta.totalFrames / meta.fps;
  const lines = [
    `dataset   ${meta.root}`,
    `version   ${meta.codebaseVersion}${meta.robotType ? `, robot ${meta.robotType}` : ''}`,
    `fps       ${meta.fps}`,
    `episodes  ${meta.episodes.length} (length min ${minLen}, mean ${meanLen.toFixed(1)}, max ${maxLen} frames)`,
    `frames    ${meta.totalFrames} (${seconds.toFixed(1)} s)`,
    `tasks     ${meta.tasks.size}${meta.tasks.size ? `: ${[...meta.tasks.values()].slice(0, 3).map((t) => JSON.stringify(t)).join(', ')}${meta.tasks.size > 3 ? ', ...' : ''}` : ''}`,
    `cameras   ${meta.cameras.length}`,
    ...meta.cameras.map((c) => `  ${c.name.padEnd(16)} ${c.kind} ${c.width}x${c.height}${c.codec ? ` ${c.codec}` : ''} (${c.key})`),
    `state     ${meta.stateDim} dims: ${names(meta.stateNames)}`,
    `action    ${meta.actionDim} dims: ${names(meta.actionNames)}`,
    ...explainActionSpace(meta),
  ];
  return lines.join('\n');
}
