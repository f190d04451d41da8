/**
 * ZMTP command bodies (RFC 23 §2.5, RFC 37 for PING/PONG): a 1-byte name length, the name, then
 * command data. Only what a SUB needs: READY both ways, ERROR in, PING in and PONG out, and the
 * subscription, which ZMTP 3.0 sends as an ordinary message `0x01`+topic.
 */

import type { ZmtpFault } from "../ZmtpError.js"

export const FLAG_MORE = 0x01
export const FLAG_LONG = 0x02
export const FLAG_COMMAND = 0x04

/** One frame on the wire: flags, a 1- or 8-byte size, the body. */
export const encodeFrame = (flags: number, body: Uint8Array): Buffer => {
  const long = body.length > 255
  const header = long ? 9 : 2
  const out = Buffer.allocUnsafe(header + body.length)
  out[0] = flags | (long ? FLAG_LONG : 0)
  if (long) {
    out.writeUInt32BE(Math.floor(body.length / 4294967296), 1)
    out.writeUInt32BE(body.length >>> 0, 5)
  } else out[1] = body.length
  out.set(body, header)
  return out
}

const named = (name: string, data: Uint8Array): Buffer => {
  const body = Buffer.allocUnsafe(1 + name.length + data.length)
  body[0] = name.length
  body.write(name, 1, "latin1")
  body.set(data, 1 + name.length)
  return body
}

/** READY with `Socket-Type: SUB` (a SUB sends no Identity). */
export const encodeReady = (socketType: string): Buffer => {
  const key = "Socket-Type"
  const property = Buffer.allocUnsafe(1 + key.length + 4 + socketType.length)
  property[0] = key.length
  property.write(key, 1, "latin1")
  property.writeUInt32BE(socketType.length, 1 + key.length)
  property.write(socketType, 1 + key.length + 4, "latin1")
  return encodeFrame(FLAG_COMMAND, named("READY", property))
}

/** The 3.0 subscription message: `0x01` then the prefix. */
export const encodeSubscribe = (topic: Uint8Array): Buffer => {
  const body = Buffer.allocUnsafe(1 + topic.length)
  body[0] = 1
  body.set(topic, 1)
  return encodeFrame(0, body)
}

/** The command's name, or a fault when the body cannot hold it. */
export const commandName = (body: Buffer): string | ZmtpFault => {
  if (body.length === 0) return { reason: "command", message: "empty command frame" }
  const n = body[0]!
  if (1 + n > body.length)
    return { reason: "command", message: `command name of ${n} bytes in a ${body.length}-byte frame` }
  return body.toString("latin1", 1, 1 + n)
}

/** READY's metadata as name → value (names compared case-insensitively, RFC 23 §2.5.1). */
export const readyProperties = (body: Buffer): Map<string, Buffer> | ZmtpFault => {
  const properties = new Map<string, Buffer>()
  let at = 1 + body[0]!
  while (at < body.length) {
    const nameLength = body[at]!
    if (nameLength === 0 || at + 1 + nameLength + 4 > body.length)
      return { reason: "handshake", message: `READY property at byte ${at} is truncated` }
    const name = body.toString("latin1", at + 1, at + 1 + nameLength).toLowerCase()
    at += 1 + nameLength
    const valueLength = body.readUInt32BE(at)
    at += 4
    if (valueLength > body.length - at)
      return { reason: "handshake", message: `READY property ${JSON.stringify(name)} overruns the frame` }
    properties.set(name, body.subarray(at, at + valueLength))
    at += valueLength
  }
  return properties
}

/** ERROR's reason text (1-byte length, then the text). */
export const errorReason = (body: Buffer): string => {
  const at = 1 + body[0]!
  if (at >= body.length) return ""
  return body.toString("latin1", at + 1, Math.min(body.length, at + 1 + body[at]!))
}

/** PONG for a PING body (name, 2-byte TTL, up to 16 bytes of context echoed back). */
export const encodePong = (ping: Buffer): Buffer => {
  const contextAt = 1 + 4 + 2
  const context =
    ping.length > contextAt
      ? ping.subarray(contextAt, Math.min(ping.length, contextAt + 16))
      : ping.subarray(0, 0)
  return encodeFrame(FLAG_COMMAND, named("PONG", context))
}
