export type { Db, Migration } from './types.ts';
export { isUniqueViolation } from './types.ts';
export { SqliteDb } from './sqlite.ts';
export { PostgresDb, redactUrl } from './postgres.ts';
export { isUnavailable } from './keep.ts';
