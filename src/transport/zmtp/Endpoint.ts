/**
 * Which endpoints the ZMTP subscriber connects to itself: `tcp://HOST:PORT` with a host name,
 * an IPv4 address or a bracketed IPv6 address. Anything else (ipc, inproc, a source address
 * `tcp://src;host:port`, a wildcard) stays with zeromq.js.
 */

/** A `tcp://host:port` endpoint, parsed. */
export interface TcpEndpoint {
  readonly host: string
  readonly port: number
}

const TCP = /^tcp:\/\/(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):(\d{1,5})$/

/** The endpoint's host and port, or undefined for anything but `tcp://host:port`. */
export const parseTcpEndpoint = (endpoint: string): TcpEndpoint | undefined => {
  const match = TCP.exec(endpoint)
  if (match === null) return undefined
  const host = match[1] ?? match[2]!
  const port = Number(match[3])
  if (port < 1 || port > 65535 || host === "*") return undefined
  return { host, port }
}
