/**
 * `kvrelay`: the relay's domain API (identities, events, catalog types and their JSON codecs).
 * The CKF core is `kvrelay/ckf`.
 */

export * from "./domain/index.js"
