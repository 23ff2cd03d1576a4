// The TF.js backends and their fast paths (re-exports only): backend choice and start-up
// (backend.ts, native.ts); the fused kernels used by kernels/layers.ts and kernels/optim.ts are
// imported from their own files.
export { activateBackend, backendReport, initBackend, type BackendChoice, type BackendKind, type BackendReport } from './backend.ts';
export { applyNativeEnv, defaultThreads, installStatus, pinNativeLibrary, visibleGpus, type InstallStatus, type NativeThreads } from './native.ts';
