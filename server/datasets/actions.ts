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

/**
 * What a policy trained in `space` answers, in the words `vela policy` prints on its start-up line
 * and `vela datasets inspect` explains the action space with: always absolute actions.
 */
export function answeredAs(space: ActionSpace): string {
  return space === 'delta' ? 'absolute (trained as deltas; the state is added back)' : 'absolute';
}

/**
 * The lines `vela datasets inspect` prints for the action space: the default and why, what a
 * fine-tune learns in it and what its policy answers (answeredAs, as `vela policy` says), and
 * what `--action-space` would change. The first line is `action space default: <space> (...)`.
 */
export function explainActionSpace(meta: Pick<DatasetMeta, 'stateNames' | 'actionNames'>): string[] {
  const space = defaultActionSpace(meta);
  const pairs = deltaPairs(meta);
  const shared = pairs.map(([a]) => meta.actionNames![a]!);
  const list = shared.length <= 6 ? shared.join(', ') : `${shared.slice(0, 6).join(', ')}, ...`;
  const answers = `its policy (vela policy) answers actions ${answeredAs(space)}`;
  if (space === 'delta') {
    return [
      `action space default: delta (every action dim is named like a state dim)`,
      `  a fine-tune learns action - state on the ${pairs.length} shared dims (${list}); ${answers}`,
      `  (--action-space absolute learns the actions as they are)`,
    ];
  }
  const why = !meta.stateNames || !meta.actionNames ? 'the dataset does not name its state and action dims'
    : pairs.length === 0 ? 'no action dim is named like a state dim'
    : `the names differ: ${pairs.length} of ${meta.actionNames.length} action dims are named like state dims`;
  return [
    `action space default: absolute (${why})`,
    `  a fine-tune learns the actions as they are; ${answers}`,
    ...(pairs.length ? [`  (--action-space delta would learn action - state on the ${pairs.length} shared dims (${list}); its policy then answers actions ${answeredAs('delta')})`] : []),
  ];
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

/**
 * Every action-chunk entry the model is trained on, in the chosen space: for each frame t of each
 * episode and each k < horizon with t + k inside the episode, action[t + k] with state[t]
 * subtracted on the `pairs` dimensions (padding past the end is excluded, as the loss masks it).
 * openpi's order: transform first, then compute statistics of what the model is fed; delta
 * targets reach k steps ahead, so their spread is wider than that of action[t] - state[t] alone.
 * Example: lengths 3 and 1, horizon 2 -> rows (t, k) = (0,0) (0,1) (1,0) (1,1) (2,0) | (0,0).
 * @returns rows [n, ad] row-major, n = sum over episodes of sum_t min(horizon, l - t).
 * @throws DatasetError `bad_argument` for a horizon that is not a positive integer.
 */
export function chunkActionRows(tables: readonly EpisodeTable[], horizon: number, actionDim: number, stateDim: number, pairs: readonly [number, number][]): Float32Array {
  if (!(Number.isInteger(horizon) && horizon >= 1)) throw new DatasetError('bad_argument', `horizon ${horizon} is not a positive integer`);
  let n = 0;
  for (const tb of tables) for (let t = 0; t < tb.length; t++) n += Math.min(horizon, tb.length - t);
  const out = new Float32Array(n * actionDim); // [n, ad]
  let row = 0;
  for (const tb of tables) {
    for (let t = 0; t < tb.length; t++) {
      for (let k = 0; k < horizon && t + k < tb.length; k++, row++) {
        out.set(tb.action.subarray((t + k) * actionDim, (t + k + 1) * actionDim), row * actionDim);
        for (const [a, s] of pairs) out[row * actionDim + a] -= tb.state[t * stateDim + s];
      }
    }
  }
  return out;
}

/** A named group of action dimensions, e.g. `left arm` -> [0..6] (for per-group evaluation). */
export interface ActionGroup {
  name: string;
  /** Action dimension indices, ascending. */
  dims: number[];
}

const HAND_WORDS = new Set(['hand', 'gripper', 'finger', 'fingers', 'pinky', 'ring', 'middle', 'index', 'thumb', 'claw']);
const ARM_WORDS = new Set(['arm', 'shoulder', 'elbow', 'wrist', 'forearm', 'waist', 'joint']);

/** `kLeftHandPinky` / `left_gripper` -> lower-case words (`k left hand pinky`). */
function words(name: string): string[] {
  return name.replace(/([a-z0-9])([A-Z])/g, '$1 $2').toLowerCase().split(/[^a-z0-9]+/).filter(Boolean);
}

/**
 * Groups of action dimensions read from their names: the side (`left` / `right`) and the part
 * (`hand` or `gripper` for hand and finger words, `arm` for arm joint words or any sided
 * name, `other` else). G1's `kLeftShoulderPitch` -> `left arm`, `kRightHandThumbBend` ->
 * `right hand`; ALOHA's `left_gripper` -> `left gripper`. Groups come in order of their first
 * dimension. Returns [] when the dataset names no dimensions or everything falls in one group
 * (a single group says nothing the overall score does not).
 */
export function actionGroups(actionNames: readonly string[] | null): ActionGroup[] {
  if (!actionNames || actionNames.length === 0) return [];
  const groups = new Map<string, number[]>();
  actionNames.forEach((n, i) => {
    const w = words(n);
    const side = w.includes('left') ? 'left' : w.includes('right') ? 'right' : '';
    const handWord = w.find((x) => HAND_WORDS.has(x));
    const part = handWord ? (handWord === 'gripper' || handWord === 'claw' ? 'gripper' : 'hand') : side || w.some((x) => ARM_WORDS.has(x)) ? 'arm' : 'other';
    const key = side ? `${side} ${part}` : part;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key)!.push(i);
  });
  if (groups.size < 2) return [];
  return [...groups].map(([name, dims]) => ({ name, dims }));
}
