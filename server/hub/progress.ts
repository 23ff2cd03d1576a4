/**
 * A download's progress line on stderr (`vela datasets download`, `vela models download`), apart
 * from hub/cli.ts so that `vela models` does not load the dataset code to print it.
 */
import type { DownloadProgress } from './download.ts';

/** Bytes as megabytes, one decimal. */
export function mb(bytes: number): string {
  return (bytes / 1e6).toFixed(1);
}

/** `[#######.........] 4.2/9.4 MB  3/11 files  12.1 MB/s  ETA 0:01  videos/...mp4` */
export function downloadProgressLine(p: DownloadProgress, bytesPerS: number, width = 24): string {
  const filled = p.totalBytes > 0 ? Math.round((p.doneBytes / p.totalBytes) * width) : width;
  const eta = bytesPerS > 0 ? (p.totalBytes - p.doneBytes) / bytesPerS : Infinity;
  const etaText = Number.isFinite(eta) ? `${Math.floor(eta / 60)}:${String(Math.floor(eta % 60)).padStart(2, '0')}` : '--:--';
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${mb(p.doneBytes)}/${mb(p.totalBytes)} MB  ${p.fileIndex}/${p.files} files  ${mb(bytesPerS)} MB/s  ETA ${etaText}  ${p.file}`;
}

/**
 * A download's progress on stderr, as `vela datasets download` and `vela models download` show
 * it: on a terminal one bar redrawn at most every 100 ms; otherwise (a log) one line per file done
 * or skipped (`skipNote` after a skipped one) and one per resumed connection.
 * @param started Date.now() when the download began (the transfer rate's origin).
 */
export function progressPrinter(started: number, skipNote: string): (p: DownloadProgress) => void {
  const tty = process.stderr.isTTY;
  let lastDraw = 0;
  return (p) => {
    const rate = p.transferredBytes / Math.max(0.001, (Date.now() - started) / 1000);
    if (tty) {
      if (p.phase === 'data' && Date.now() - lastDraw < 100) return;
      lastDraw = Date.now();
      process.stderr.write(`\r\x1b[K${downloadProgressLine(p, rate)}`);
    } else if (p.phase === 'done' || p.phase === 'skip') {
      process.stderr.write(`${downloadProgressLine(p, rate)}${p.phase === 'skip' ? ` ${skipNote}` : ''}\n`);
    } else if (p.phase === 'retry') process.stderr.write(`connection broke on ${p.file}; resuming\n`);
  };
}
