/**
 * The ZMTP 3.0 greeting (RFC 23 §2.3): signature `FF 00*8 7F`, version, a 20-byte mechanism
 * name, as-server, 31 bytes of filler; 64 bytes in all.
 *
 * We announce 3.0, not 3.1: libzmq (4.3, the one in zeromq.js 6 and pyzmq) then talks to us
 * with its 3.0 encoder, and its XPUB takes a subscription either as a SUBSCRIBE command or as
 * the `0x01`+topic message that 3.0 defines, so the one form we send works with every 3.x peer.
 */

import type { ZmtpFault } from "../ZmtpError.js"

export const GREETING_BYTES = 64

const MECHANISM_AT = 12
const MECHANISM_BYTES = 20

export const encodeGreeting = (): Buffer => {
  const out = Buffer.alloc(GREETING_BYTES)
  out[0] = 0xff
  out[9] = 0x7f
  out[10] = 3
  out[11] = 0
  out.write("NULL", MECHANISM_AT, "latin1")
  return out
}

const printable = (bytes: Uint8Array): string =>
  JSON.stringify(Buffer.from(bytes).toString("latin1").replace(/\0+$/, ""))

/**
 * Checks as much of the peer's greeting as has arrived (`bytes` holds its first `bytes.length`
 * bytes, at most 64), so a peer that is not ZeroMQ is rejected on its first byte instead of
 * after a handshake timeout. The signature's padding is not checked: ZMTP 3 lets it carry
 * anything, and libzmq puts its routing-id length there.
 */
export const checkGreeting = (bytes: Uint8Array): ZmtpFault | undefined => {
  const n = bytes.length
  if (n >= 1 && bytes[0] !== 0xff)
    return {
      reason: "greeting-signature",
      message: `first byte 0x${hex(bytes[0]!)}, a ZMTP greeting starts with 0xff`
    }
  if (n >= 10 && (bytes[9]! & 0x01) === 0)
    return {
      reason: "greeting-signature",
      message: `signature byte 9 is 0x${hex(bytes[9]!)}, a ZMTP 3 greeting has its low bit set`
    }
  if (n >= 11 && bytes[10]! < 3)
    return {
      reason: "greeting-version",
      message: `ZMTP major version ${bytes[10]}, 3 is the lowest supported`
    }
  if (n >= MECHANISM_AT + MECHANISM_BYTES) {
    const mechanism = bytes.subarray(MECHANISM_AT, MECHANISM_AT + MECHANISM_BYTES)
    if (!isNull(mechanism))
      return {
        reason: "mechanism",
        message: `security mechanism ${printable(mechanism)}, only NULL is supported`
      }
  }
  return undefined
}

const isNull = (mechanism: Uint8Array): boolean => {
  if (mechanism[0] !== 0x4e || mechanism[1] !== 0x55 || mechanism[2] !== 0x4c || mechanism[3] !== 0x4c)
    return false
  for (let i = 4; i < mechanism.length; i++) if (mechanism[i] !== 0) return false
  return true
}

const hex = (byte: number): string => byte.toString(16).padStart(2, "0")
