import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Makes .venv (the Python that plays OpenPI's client) on first run; see the file.
    globalSetup: ['test/setup/python-env.ts'],
    // Model tests are CPU-heavy; two cores is the CI machine.
    pool: 'forks',
    maxWorkers: 2,
    // Real-engine tests on a loaded 2-core machine: generous, since a slow pass is not a failure.
    testTimeout: 300_000,
    hookTimeout: 120_000,
  },
});
