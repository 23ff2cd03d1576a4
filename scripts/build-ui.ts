/**
 * Build the dashboard (ui/src) into ui/dist with esbuild: one ES module bundle
 * (uPlot included) and one CSS file, both named by content hash so that the server can cache
 * them for a year, and index.html pointing at them (served with `no-cache`). The folder is
 * swapped in whole with renames, so a running server never serves half a build.
 *
 * Usage: `tsx scripts/build-ui.ts [--dev]` (--dev: no minification).
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';
import { UI_DIST_DIR } from '../server/ui/assets.ts';

const SRC_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../ui/src');

export interface BuildResult {
  outDir: string;
  /** Paths relative to outDir, sorted. */
  files: string[];
  ms: number;
}

/**
 * @param opts.outDir where the build lands (default ui/dist); replaced whole.
 * @param opts.minify default true.
 * @throws Error with esbuild's messages when the source does not compile.
 */
export async function buildUi(opts: { outDir?: string; minify?: boolean } = {}): Promise<BuildResult> {
  const t0 = performance.now();
  const outDir = path.resolve(opts.outDir ?? UI_DIST_DIR);
  const parent = path.dirname(outDir);
  fs.mkdirSync(parent, { recursive: true });
  const tmp = fs.mkdtempSync(path.join(parent, '.dist-new-'));
  fs.chmodSync(tmp, 0o755); // mkdtemp makes 0700; a server under another user must read it
  try {
    const result = await esbuild.build({
      entryPoints: { app: path.join(SRC_DIR, 'main.ts') },
      bundle: true,
      format: 'esm',
      // Current Chromium and Firefox (and Safari 16.4+): top-level ESM, TextDecoderStream.
      target: ['chrome111', 'firefox111', 'safari16.4'],
      entryNames: '[name]-[hash]',
      outdir: tmp,
      minify: opts.minify ?? true,
      sourcemap: 'linked',
      metafile: true,
      logLevel: 'silent',
      legalComments: 'linked',
    });
    const outputs = Object.entries(result.metafile.outputs);
    const js = outputs.find(([, o]) => o.entryPoint !== undefined && !o.entryPoint.endsWith('.css'));
    if (!js) throw new Error(`esbuild produced no entry bundle: ${outputs.map(([f]) => f).join(', ')}`);
    const css = js[1].cssBundle;
    if (!css) throw new Error('esbuild produced no CSS bundle (main.ts must import styles.css)');
    const html = fs.readFileSync(path.join(SRC_DIR, 'index.html'), 'utf8')
      .replace('%APP_JS%', `./${path.basename(js[0])}`)
      .replace('%APP_CSS%', `./${path.basename(css)}`);
    fs.writeFileSync(path.join(tmp, 'index.html'), html);

    const old = fs.existsSync(outDir) ? fs.mkdtempSync(path.join(parent, '.dist-old-')) : null;
    if (old) fs.renameSync(outDir, path.join(old, 'dist'));
    fs.renameSync(tmp, outDir);
    if (old) fs.rmSync(old, { recursive: true, force: true });
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    const errors = (e as { errors?: esbuild.Message[] }).errors;
    if (errors?.length) {
      const text = errors.map((m) => `${m.location ? `${m.location.file}:${m.location.line}: ` : ''}${m.text}`).join('\n');
      throw new Error(`the dashboard does not build:\n${text}`);
    }
    throw e;
  }
  const files = fs.readdirSync(outDir, { recursive: true, encoding: 'utf8' })
    .filter((f) => fs.statSync(path.join(outDir, f)).isFile())
    .sort();
  return { outDir, files, ms: performance.now() - t0 };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  buildUi({ minify: !process.argv.includes('--dev') }).then(
    (r) => console.log(`dashboard built in ${r.ms.toFixed(0)} ms: ${r.outDir} (${r.files.join(', ')})`),
    (e) => {
      console.error((e as Error).message);
      process.exit(1);
    },
  );
}
