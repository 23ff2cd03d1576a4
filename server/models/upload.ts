/**
 * Uploads a checkpoint folder to a Hugging Face Hub model repository (`vela models upload`),
 * through @huggingface/hub (createRepo, uploadFilesWithProgress): the library does the Hub's
 * protocol (preupload, git-lfs batch, LFS PUTs, the NDJSON commit) and skips LFS objects the hub
 * already holds, so uploading the same folder again sends no weights. What is here: which files
 * go (every file under the folder, recursively, but `.git/` and `.cache/` at its top, as
 * huggingface_hub's upload_folder leaves them out), a model card when the folder has none (with
 * its Training section from the job's `vela_training.json` where a Vela job made it), the
 * token's sources, and the hub's refusals in the models layer's words (ModelError).
 */
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { pathToFileURL } from 'node:url';
import { createRepo, HubApiError, uploadFilesWithProgress } from '@huggingface/hub';
import { ModelError } from './errors.ts';

/** Where a token may come from, in this order (named by the no-token error). */
export const TOKEN_SOURCES = '--token, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, or the token file ($HF_HOME/token, else ~/.cache/huggingface/token, written by `hf auth login`)';

/**
 * The write token: `flag` (--token), else HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else the token
 * file huggingface_hub's login writes ($HF_HOME/token, else $XDG_CACHE_HOME/huggingface/token,
 * else ~/.cache/huggingface/token), trimmed; null when none of them holds one.
 */
export function resolveWriteToken(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string | null {
  if (flag) return flag;
  if (env.HF_TOKEN) return env.HF_TOKEN;
  if (env.HUGGING_FACE_HUB_TOKEN) return env.HUGGING_FACE_HUB_TOKEN;
  const home = env.HF_HOME || path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'huggingface');
  try {
    const t = fs.readFileSync(path.join(home, 'token'), 'utf8').trim();
    return t || null;
  } catch {
    return null;
  }
}

/** The files to upload: paths relative to `dir` with `/`, sorted. Follows symlinks (a cache snapshot is links). */
export function checkpointFiles(dir: string): string[] {
  const out: string[] = [];
  const visit = (rel: string) => {
    for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (!rel && (e.name === '.git' || e.name === '.cache')) continue;
      const isDir = e.isSymbolicLink() ? fs.statSync(path.join(dir, r)).isDirectory() : e.isDirectory();
      if (isDir) visit(r);
      else out.push(r);
    }
  };
  visit('');
  return out.sort();
}

/**
 * A short model card (README.md) for a folder that has none, from what its config.json says:
 * the model (`preset`, else `type`), the base it was trained from (`base_checkpoint`: a cache
 * snapshot path is named by its repo id, another path as a folder of the training machine), the
 * dataset (`dataset`, a string or `{repo_id}`), the fine-tune kind (`finetune`); what it does not
 * say is written as unknown, never guessed.
 */
export function modelCard(repoId: string, config: Record<string, unknown> | null, training?: string[]): string {
  const str = (v: unknown) => (typeof v === 'string' && v ? v : null);
  const model = str(config?.preset) ?? str(config?.type);
  const base = str(config?.base_checkpoint);
  const ds = config?.dataset;
  const dataset = str(ds) ?? (ds && typeof ds === 'object' ? str((ds as Record<string, unknown>).repo_id) : null);
  const finetune = str(config?.finetune);
  // base_checkpoint is the folder the trainer read: a Hugging Face cache snapshot names its repo.
  const cached = base ? /(?:^|[\\/])models--([^\\/]+?)--([^\\/]+)[\\/]snapshots[\\/]/.exec(base) : null;
  const baseText = !base ? null : cached ? `${cached[1]}/${cached[2]} (from the Hugging Face cache: ${base})` : path.isAbsolute(base) || base.startsWith('.') ? `${base} (a folder on the machine that trained it)` : base;
  const tags = ['vela', 'robotics', ...(model ? [model] : [])];
  const unknown = 'unknown (config.json does not say)';
  return [
    '---',
    'tags:',
    ...tags.map((t) => `- ${t}`),
    'pipeline_tag: robotics',
    '---',
    '',
    `# ${repoId}`,
    '',
    'A checkpoint uploaded by `vela models upload`. What its config.json records:',
    '',
    `- model: ${model ?? (config ? unknown : 'unknown (the folder has no readable config.json)')}`,
    `- base checkpoint: ${baseText ?? (config ? unknown : 'unknown')}`,
    `- dataset: ${dataset ?? (config ? unknown : 'unknown')}`,
    ...(finetune ? [`- fine-tune: ${finetune}`] : []),
    '',
    ...(training?.length ? ['## Training', '', ...training] : ['Nothing else about its training or its quality is known to this card.']),
    '',
  ].join('\n');
}

/** The file a Vela job writes into its model's folder: how the model was made (TrainingRecord). */
export const TRAINING_RECORD = 'vela_training.json';

/**
 * How a Vela fine-tune made a model, as its job wrote it (`vela_training.json`, beside the
 * weights) when it succeeded: what the model card's Training section is written from, by a job's
 * `push_to_hub` and by a later `vela models upload` of the same folder alike. Numbers as the
 * server ran them (units: learning rates per step, decays per step; `eval_*` as in PROTOCOL.md
 * section 1: normalised MSE and its ratios to two baselines).
 */
export interface TrainingRecord {
  /** The server job's id; null for a local `vela finetune` run. */
  job_id: string | null;
  model: string;
  /** The base checkpoint trained from, as the job named it; null for a model trained from its init. */
  base: string | null;
  dataset_name: string;
  /** What was held out for evaluation, in words ("none" when nothing was). */
  held_out: string;
  recipe: {
    finetune: string;
    lora_rank: number | null;
    lora_alpha: number | null;
    steps: number;
    batch_size: number;
    learning_rate: number;
    warmup_steps: number;
    lr_floor: number;
    weight_decay: number;
    ema_decay: number | null;
    seed: number;
  };
  /** The last held-out evaluation; null when none was run. */
  held_out_eval: { step: number; eval_mse: number; eval_ratio_hold_state: number | null; eval_ratio_mean_chunk: number | null; eval_frames: number | null } | null;
}

/** The card's Training section (markdown lines) from a job's TrainingRecord. */
export function trainingCard(r: TrainingRecord): string[] {
  const n = (v: unknown) => (typeof v === 'number' ? String(Number(v.toPrecision(4))) : 'n/a');
  const c = r.recipe;
  const e = r.held_out_eval;
  return [
    `Fine-tuned by ${r.job_id ? `the Vela job ${r.job_id}` : 'a local `vela finetune` run'}:`,
    '',
    `- model: ${r.model}${r.base ? ` from ${r.base}` : ''}; dataset: ${r.dataset_name}; held out: ${r.held_out}`,
    `- recipe: ${c.finetune}${c.finetune === 'lora' ? ` (rank ${c.lora_rank}, alpha ${c.lora_alpha})` : ''}, ${c.steps} steps, batch ${c.batch_size}, learning rate ${c.learning_rate} (warm-up ${c.warmup_steps}, cosine to ${c.lr_floor}x), AdamW weight decay ${c.weight_decay}, EMA ${c.ema_decay}, seed ${c.seed}`,
    e
      ? `- held-out evaluation at step ${e.step}: eval_mse ${n(e.eval_mse)} (normalised), ${n(e.eval_ratio_hold_state)}x the hold-the-state baseline, ${n(e.eval_ratio_mean_chunk)}x the mean-chunk baseline, on ${e.eval_frames ?? 'n/a'} frames`
      : '- held-out evaluation: none was run (nothing held out)',
  ];
}

/** The folder's TrainingRecord, or null when it has none (or one this version cannot read). */
export function readTrainingRecord(dir: string): TrainingRecord | null {
  try {
    const r = JSON.parse(fs.readFileSync(path.join(dir, TRAINING_RECORD), 'utf8')) as TrainingRecord;
    return (typeof r?.job_id === 'string' || r?.job_id === null) && typeof r.model === 'string' && r.recipe && typeof r.recipe === 'object' ? r : null;
  } catch {
    return null;
  }
}

export interface ModelUploadOptions {
  /** The checkpoint folder. */
  dir: string;
  /** `namespace/name`. */
  repoId: string;
  /** The branch to commit to; default `main` (another must exist already). */
  revision?: string;
  /** Default `https://huggingface.co`. */
  endpoint?: string;
  /** A write token. */
  token: string;
  /** Create the repo private when it does not exist (an existing one keeps its visibility). */
  private?: boolean;
  /** Progress lines (no newline), for stderr. */
  onLine?: (line: string) => void;
}

export interface ModelUploadResult {
  /** Whether this call created the repo. */
  created: boolean;
  /** The commit made. */
  commit: string;
  /** Paths committed (README.md included when a card was added). */
  files: string[];
  /** Whether README.md is the generated card. */
  cardAdded: boolean;
  /** LFS files whose bytes were sent, and those the hub already held. */
  lfsUploaded: number;
  lfsSkipped: number;
}

/**
 * Uploads every file of `opts.dir` to the model repo `opts.repoId`, creating it if missing, in one
 * commit on `opts.revision`.
 * @throws ModelError: `not_found` (no folder, an empty one, or no such branch), `unauthorized`
 *   (401/403: no write access), `network` (unreachable, another answer).
 */
export async function uploadModel(opts: ModelUploadOptions): Promise<ModelUploadResult> {
  const { dir, repoId } = opts;
  const revision = opts.revision ?? 'main';
  const endpoint = (opts.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const say = opts.onLine ?? (() => {});
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) throw new ModelError('not_found', `${dir}: no such folder`);
  const paths = checkpointFiles(dir);
  if (paths.length === 0) throw new ModelError('not_found', `${dir}: the folder is empty, nothing to upload`);
  const files: { path: string; content: URL | Blob }[] = paths.map((p) => ({ path: p, content: pathToFileURL(path.join(dir, ...p.split('/'))) }));
  let cardAdded = false;
  if (!paths.includes('README.md')) {
    let config: Record<string, unknown> | null = null;
    try {
      config = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    } catch {
      // No card facts then: the card says unknown.
    }
    const record = readTrainingRecord(dir);
    files.push({ path: 'README.md', content: new Blob([modelCard(repoId, config, record ? trainingCard(record) : undefined)]) });
    cardAdded = true;
  }
  const refused = (e: unknown, what: string): ModelError => {
    if (e instanceof ModelError) return e;
    if (e instanceof HubApiError) {
      const said = e.message.replace(/\. URL: .*$/, '');
      if (e.statusCode === 401 || e.statusCode === 403) {
        return new ModelError('unauthorized', `${repoId}: no write access (a gated or another's repo, or a read-only token) on ${endpoint}: the hub answered ${e.statusCode} to ${what} (${said}); use a write token (https://huggingface.co/settings/tokens) of an account that may write there`);
      }
      if (e.statusCode === 404 && /rev/i.test(said)) return new ModelError('not_found', `${repoId} has no branch ${revision} on ${endpoint}: create it first, or upload to main`);
      return new ModelError('network', `${repoId}: the hub answered ${e.statusCode} to ${what} (${said})`);
    }
    const err = e as Error & { cause?: Error };
    // fetch's own failure (refused, DNS, reset) carries the cause; anything else is the library's word.
    if (err.cause || err.message === 'fetch failed') return new ModelError('network', `${repoId}: cannot reach ${endpoint} (${err.cause?.message ?? err.message})`);
    return new ModelError('network', `${repoId}: ${what} failed: ${err.message}`);
  };

  let created = false;
  try {
    await createRepo({ repo: { type: 'model', name: repoId }, accessToken: opts.token, hubUrl: endpoint, ...(opts.private ? { private: true } : {}) });
    created = true;
    say(`created ${opts.private ? 'private ' : ''}model repo ${repoId} on ${endpoint}`);
  } catch (e) {
    // 409: it exists (the hub's answer to creating it again); anything else is a refusal.
    if (!(e instanceof HubApiError && e.statusCode === 409)) throw refused(e, 'creating the repo');
    say(`model repo ${repoId} exists on ${endpoint}${opts.private ? ' (its visibility is left as it is; --private applies to a new repo)' : ''}`);
  }

  const sizes = new Map(paths.map((p) => [p, fs.statSync(path.join(dir, ...p.split('/'))).size]));
  const started = new Set<string>();
  const finished = new Set<string>();
  let lfsUploaded = 0;
  let lfsSkipped = 0;
  let phase = '';
  let output;
  try {
    const it = uploadFilesWithProgress({
      repo: { type: 'model', name: repoId },
      accessToken: opts.token,
      hubUrl: endpoint,
      branch: revision,
      files,
      commitTitle: `Upload ${path.basename(path.resolve(dir))} with vela models upload`,
    });
    for (;;) {
      const step = await it.next();
      if (step.done) {
        output = step.value;
        break;
      }
      const ev = step.value;
      if (ev.event === 'phase') {
        phase = ev.phase;
        if (ev.phase === 'preuploading') say(`checking ${files.length} files with the hub`);
        else if (ev.phase === 'committing') say(`committing ${files.length} files to ${repoId}@${revision}`);
      } else if (ev.state === 'uploading' && phase === 'uploadingLargeFiles') {
        // An LFS file the hub needs gets a 0 first; one it already holds gets only the 1.
        if (ev.progress < 1) started.add(ev.path);
        else if (!finished.has(ev.path) && sizes.has(ev.path)) {
          finished.add(ev.path);
          const bytes = sizes.get(ev.path)!;
          if (started.has(ev.path)) {
            lfsUploaded++;
            say(`uploaded ${ev.path} (${bytes} bytes)`);
          } else {
            lfsSkipped++;
            say(`${ev.path} (${bytes} bytes): already on the hub, not sent`);
          }
        }
      }
    }
  } catch (e) {
    throw refused(e, 'the upload');
  }
  return { created, commit: output?.commit.oid ?? '', files: files.map((f) => f.path).sort(), cardAdded, lfsUploaded, lfsSkipped };
}
