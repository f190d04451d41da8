import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The end-to-end tests run the compiled CLI: build dist/ once per run when it is stale.
    globalSetup: ["test/e2e/build.globalSetup.ts"],
    // Bounds for a busy machine: a passing run takes a fraction of them.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    sequence: { concurrent: false }
  }
})
