/**
 * Ports for the demo's startup checks: the demo listens on a base port and the two after it, so a
 * test that makes one of them busy needs the other two free. A port the kernel hands out says
 * nothing about its neighbours (on a shared machine another process may hold one), so the run
 * is found by binding all three, and only the busy one stays bound.
 */

import * as net from "node:net"

const listen = (port: number): Promise<net.Server | undefined> =>
  new Promise((resolve) => {
    const server = net.createServer()
    server.once("error", () => resolve(undefined))
    server.listen(port, "127.0.0.1", () => resolve(server))
  })

const close = (server: net.Server): Promise<void> => new Promise((resolve) => server.close(() => resolve()))

/** Three consecutive free ports `base, base+1, base+2`, with `base + busy` held until `release`. */
export const demoPortsWithOneBusy = async (
  busy: 0 | 1 | 2
): Promise<{ readonly base: number; readonly busyPort: number; readonly release: () => Promise<void> }> => {
  for (let attempt = 0; attempt < 200; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 40_000)
    const servers: Array<net.Server> = []
    for (let i = 0; i < 3; i++) {
      const server = await listen(base + i)
      if (server === undefined) break
      servers.push(server)
    }
    if (servers.length === 3) {
      for (const [i, server] of servers.entries()) if (i !== busy) await close(server)
      const held = servers[busy]!
      return { base, busyPort: base + busy, release: () => close(held) }
    }
    for (const server of servers) await close(server)
  }
  throw new Error("no run of three free ports found in 200 attempts")
}
