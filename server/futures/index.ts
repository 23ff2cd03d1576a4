/** The futures API (`/api/v1/...`, PROTOCOL.md section 7): mount it on the server's app. */
export { mountFutures, type FuturesDeps, type FuturesHandle } from './routes.ts';
export { FutureStore, type Future, type Outcome } from './store.ts';
export { SeqOrder } from './seq.ts';
