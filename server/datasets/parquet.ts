/**
 * Parquet access through hyparquet, with every failure turned into a DatasetError naming the file.
 * Files are opened with `asyncBufferFromFile` (reads ranges on demand, never the whole file), and
 * the footer metadata is parsed once per file and kept on the handle.
 */
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from 'hyparquet';
import type { AsyncBuffer, Compressors, FileMetaData } from 'hyparquet';
import { initZstd, zstdDecompressSized } from '../../protocol/zstd.ts';
import { DatasetError } from './errors.ts';

let compressorsLoading: Promise<Compressors> | null = null;

/**
 * Decompressors beyond hyparquet's built-in SNAPPY: GZIP (node zlib) and ZSTD (zstd-wasm, loaded
 * once), the codecs that pyarrow/pandas writers commonly choose.
 */
function loadCompressors(): Promise<Compressors> {
  compressorsLoading ??= (async () => {
    // The process's one zstd module (a second init of the library breaks the first's contexts).
    await initZstd();
    return {
      GZIP: (input: Uint8Array) => new Uint8Array(zlib.gunzipSync(input)),
      ZSTD: zstdDecompressSized,
    };
  })();
  return compressorsLoading;
}

export interface ParquetHandle {
  /** Path relative to the dataset root (for messages). */
  rel: string;
  file: AsyncBuffer;
  metadata: FileMetaData;
  numRows: number;
  /** Top-level column names. */
  columns: string[];
}

/**
 * Opens a parquet file and parses its footer.
 * @throws DatasetError `missing_file` when absent, `corrupt_file` when the footer does not parse.
 */
export async function openParquet(root: string, rel: string): Promise<ParquetHandle> {
  const abs = path.join(root, rel);
  if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `parquet file ${rel} is missing`);
  let file: AsyncBuffer;
  let metadata: FileMetaData;
  try {
    file = await asyncBufferFromFile(abs);
    metadata = await parquetMetadataAsync(file);
  } catch (err) {
    throw new DatasetError('corrupt_file', `parquet file ${rel} is corrupt: ${(err as Error).message}`);
  }
  // Top-level columns are the children of the schema root; nested list/struct parts are skipped.
  const columns: string[] = [];
  const schema = metadata.schema;
  let i = 1;
  const skip = (idx: number): number => {
    let next = idx + 1;
    for (let c = 0; c < (schema[idx].num_children ?? 0); c++) next = skip(next);
    return next;
  };
  while (i < schema.length) {
    columns.push(schema[i].name);
    i = skip(i);
  }
  return { rel, file, metadata, numRows: Number(metadata.num_rows), columns };
}

/**
 * Reads rows [rowStart, rowEnd) of the named columns as objects (int64 come back as bigint).
 * `utf8: false` keeps unannotated byte arrays (image bytes) as Uint8Array; strings annotated as
 * such still decode as strings.
 * @throws DatasetError `corrupt_file` naming the file when a page fails to decode.
 */
export async function readRows(
  h: ParquetHandle,
  columns: string[],
  rowStart = 0,
  rowEnd = h.numRows,
  utf8 = true,
): Promise<Record<string, unknown>[]> {
  try {
    const compressors = await loadCompressors();
    return await parquetReadObjects({ file: h.file, metadata: h.metadata, columns, rowStart, rowEnd, compressors, utf8 });
  } catch (err) {
    throw new DatasetError('corrupt_file', `parquet file ${h.rel} is corrupt: ${(err as Error).message}`);
  }
}

/** A parquet integer or float (number | bigint) as a JS number. */
export function num(v: unknown): number {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  return Number.NaN;
}
