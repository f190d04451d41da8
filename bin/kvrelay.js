#!/usr/bin/env node
// Entry point of the `kvrelay` command: the compiled CLI lives in dist/ (built by `npm ci` through
// the `prepare` script, or by `npm run build`).
import("../dist/src/cli/main.js").catch((error) => {
  if (error && error.code === "ERR_MODULE_NOT_FOUND" && String(error.message).includes("main.js")) {
    console.error("kvrelay is not built yet: run `npm run build` (npm ci builds it too)")
    process.exit(1)
  }
  throw error
})
