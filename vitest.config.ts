import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The end-to-end tests run the compiled CLI: build dist/ once per run when it is stale.
    globalSetup: ["test/e2e/build.globalSetup.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    pool: "forks",
    sequence: { concurrent: false }
  }
})
