/**
 * Action chunks and action spaces. A chunk at frame t is `action[t : t + ah]`, padded past the
 * episode's end with the episode's last action and masked there (1 valid, 0 padding). In the
 * `delta` space each action dimension that the state shares by name has the current state
 * (at t, for the whole chunk) subtracted, as openpi's DeltaActions transform does; the policy
 * server adds it back (MODEL.md "Normalisation").
 */
import { DatasetError } from './errors.ts';
import type { ActionSpace, DatasetMeta, EpisodeTable } from './types.ts';

/** [actionDim, stateDim] index pairs of the dimensions that action and state share by name. */
export function deltaPairs(meta: Pick<DatasetMeta, 'stateNames' | 'actionNames'>): [number, number][] {
  const { stateNames, actionNames } = meta;
  if (!stateNames || !actionNames) return [];
  const stateAt = new Map(stateNames.map((n, i) => [n, i] as const));
  const pairs: [number, number][] = [];
  actionNames.forEach((n, a) => {
    const s = stateAt.get(n);
    if (s !== undefined) pairs.push([a, s]);
  });
  return pairs;
}

/** MODEL.md: `delta` when the dataset's state and action names match exactly, else `absolute`. */
export function defaultActionSpace(meta: Pick<DatasetMeta, 'stateNames' | 'actionNames'>): ActionSpace {
  const { stateNames, actionNames } = meta;
  if (!stateNames || !actionNames || stateNames.length !== actionNames.length) return 'absolute';
  return stateNames.every((n, i) => n === actionNames[i]) ? 'delta' : 'absolute';
}

/**
 * The pairs to subtract for an action space (empty for `absolute`).
 * @throws DatasetError `bad_argument` when `delta` is asked of a dataset whose state and action
 *   share no dimension name.
 */
export function pairsFor(meta: Pick<DatasetMeta, 'stateNames' | 'actionNames'>, space: ActionSpace): [number, number][] {
  if (space === 'absolute') return [];
  if (space !== 'delta') throw new DatasetError('bad_argument', `action_space ${JSON.stringify(space)} is not "delta" or "absolute"`);
  const pairs = deltaPairs(meta);
  if (pairs.length === 0) {
    throw new DatasetError('bad_argument', 'action_space "delta" needs state and action dimensions with shared names; this dataset has none (use "absolute")');
  }
  return pairs;
}

/**
 * The action chunk at frame t.
 * @param pairs from `pairsFor` (empty: absolute).
 * @returns actions [ah, ad] row-major and mask [ah].
 * Example: an episode of length 5, t = 3, ah = 4 -> rows = action[3], action[4], action[4],
 * action[4]; mask = [1, 1, 0, 0].
 */
export function actionChunk(table: EpisodeTable, t: number, horizon: number, actionDim: number, stateDim: number, pairs: readonly [number, number][]): { actions: Float32Array; mask: Float32Array } {
  if (!(Number.isInteger(horizon) && horizon >= 1)) throw new DatasetError('bad_argument', `horizon ${horizon} is not a positive integer`);
  if (!(Number.isInteger(t) && t >= 0 && t < table.length)) throw new DatasetError('bad_argument', `frame ${t} is outside episode ${table.episodeIndex} (0..${table.length - 1})`);
  const actions = new Float32Array(horizon * actionDim); // [ah, ad]
  const mask = new Float32Array(horizon); // [ah]
  for (let h = 0; h < horizon; h++) {
    const src = Math.min(t + h, table.length - 1);
    mask[h] = t + h < table.length ? 1 : 0;
    actions.set(table.action.subarray(src * actionDim, (src + 1) * actionDim), h * actionDim);
    for (const [a, s] of pairs) actions[h * actionDim + a] -= table.state[t * stateDim + s];
  }
  return { actions, mask };
}
