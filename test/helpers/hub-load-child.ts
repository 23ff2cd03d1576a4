/**
 * Child process for the peak-RSS test of server/models/hub-checkpoint.ts: loads a Hub-layout
 * checkpoint into float32 parameters it keeps (as a model holds them) and prints one JSON line
 * with its resident set before and after, read from /proc/self/status (VmRSS, VmHWM = peak).
 *   node --import tsx test/helpers/hub-load-child.ts <dir> '<PiShapeConfig json>'
 */
import fs from 'node:fs';
import { readHubCheckpoint } from '../../server/models/hub-checkpoint.ts';

function statusBytes(field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(fs.readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
}

const [dir, cfgJson] = process.argv.slice(2);
const baselineRss = statusBytes('VmRSS');
const t0 = performance.now();
const ckpt = await readHubCheckpoint(dir!, JSON.parse(cfgJson!));
const loadMs = performance.now() - t0;
let f32Bytes = 0;
let checksum = 0;
for (const { data } of ckpt.params!.values()) {
  f32Bytes += data.byteLength;
  checksum += data[0]! + data[data.length - 1]!;
}
process.stdout.write(`${JSON.stringify({ baselineRss, peakRss: statusBytes('VmHWM'), rss: statusBytes('VmRSS'), f32Bytes, loadMs, tensors: ckpt.params!.size, dtypes: ckpt.dtypes, checksum })}\n`);
