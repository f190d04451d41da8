/**
 * TLS material (PROTOCOL.md §1 ◆): the servers' `--tls-cert`, `--tls-key` and `--tls-client-ca`,
 * and the global consumer's `--relay-ca`, `--relay-cert` and `--relay-key` for its connections to
 * relays. PEM files are read once at startup and checked here, so that a file that cannot be used
 * is reported against its flag before anything listens, instead of as a handshake failure on the
 * first connection.
 */

import { createPrivateKey, type KeyObject, X509Certificate } from "node:crypto"
import { readFile } from "node:fs/promises"
import { createSecureContext } from "node:tls"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Agent } from "@effect/platform-node/Undici"
import { Effect, Layer } from "effect"
import { FlagFileError, fileErrorText } from "./FlagFile.js"

/** A TLS file that cannot be used: missing, unreadable, not PEM, or not matching its pair. */
export class TlsMaterialError extends FlagFileError("TlsMaterialError") {}

/** A file named by a flag. */
export interface TlsFile {
  readonly flag: string
  readonly path: string
}

/** What `https.createServer` takes: the server's chain and key, and client verification. */
export interface ServerTlsOptions {
  readonly cert: string
  readonly key: string
  readonly ca?: string | undefined
  /** Set with a client CA: the handshake asks for a client certificate and refuses one missing or unverified. */
  readonly requestCert: boolean
  readonly rejectUnauthorized: boolean
}

/** What a TLS client connection takes (undici's `connect` options). */
export interface ClientTlsOptions {
  /** Replaces the default trust store when given. */
  readonly ca?: string | undefined
  readonly cert?: string | undefined
  readonly key?: string | undefined
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g

const fail = (file: TlsFile, reason: string) =>
  Effect.fail(new TlsMaterialError({ flag: file.flag, path: file.path, reason }))

const readPem = (file: TlsFile): Effect.Effect<string, TlsMaterialError> =>
  Effect.tryPromise({
    try: () => readFile(file.path, "utf8"),
    catch: (cause) =>
      new TlsMaterialError({
        flag: file.flag,
        path: file.path,
        reason: `cannot read ${file.path}: ${fileErrorText(cause)}`
      })
  })

/** Every certificate of a PEM file (a chain or a CA bundle), each parsed. */
const readCertificates = (
  file: TlsFile
): Effect.Effect<
  { readonly pem: string; readonly certificates: ReadonlyArray<X509Certificate> },
  TlsMaterialError
> =>
  Effect.flatMap(readPem(file), (pem) => {
    const blocks = pem.match(PEM_CERTIFICATE) ?? []
    if (blocks.length === 0) return fail(file, `${file.path} holds no PEM certificate`)
    const certificates: Array<X509Certificate> = []
    for (const [i, block] of blocks.entries()) {
      try {
        certificates.push(new X509Certificate(block))
      } catch (cause) {
        return fail(file, `${file.path}: certificate ${i + 1} is invalid: ${fileErrorText(cause)}`)
      }
    }
    return Effect.succeed({ pem, certificates })
  })

const readKey = (
  file: TlsFile
): Effect.Effect<{ readonly pem: string; readonly key: KeyObject }, TlsMaterialError> =>
  Effect.flatMap(readPem(file), (pem) => {
    try {
      return Effect.succeed({ pem, key: createPrivateKey(pem) })
    } catch (cause) {
      return fail(file, `${file.path} holds no usable private key: ${fileErrorText(cause)}`)
    }
  })

/**
 * A certificate chain and its key: the leaf (first certificate) must be in force and match the
 * key. Expiry is checked because a server with an expired certificate would start and then fail
 * every handshake.
 */
const readPair = (
  certFile: TlsFile,
  keyFile: TlsFile,
  now: number
): Effect.Effect<{ readonly cert: string; readonly key: string }, TlsMaterialError> =>
  Effect.gen(function* () {
    const { pem: cert, certificates } = yield* readCertificates(certFile)
    const { pem: key, key: keyObject } = yield* readKey(keyFile)
    const leaf = certificates[0]!
    if (Date.parse(leaf.validTo) < now) {
      return yield* fail(certFile, `${certFile.path}: the certificate expired on ${leaf.validTo}`)
    }
    if (!leaf.checkPrivateKey(keyObject)) {
      return yield* fail(
        keyFile,
        `${keyFile.path} is not the private key of the certificate in ${certFile.flag} ${certFile.path}`
      )
    }
    return { cert, key }
  })

/** Node's own last word on the material (e.g. a key type OpenSSL refuses for TLS). */
const checkContext = (
  blame: TlsFile,
  options: { readonly cert?: string; readonly key?: string; readonly ca?: string }
): Effect.Effect<void, TlsMaterialError> => {
  try {
    createSecureContext(options)
    return Effect.void
  } catch (cause) {
    return fail(blame, `${blame.path} cannot be used for TLS: ${fileErrorText(cause)}`)
  }
}

/** The files behind a server's TLS (the CLI checks that cert and key come together). */
interface ServerTlsFiles {
  readonly cert: TlsFile
  readonly key: TlsFile
  readonly clientCa?: TlsFile | undefined
}

/** Reads and checks a server's certificate, key and optional client CA. */
export const loadServerTls = (files: ServerTlsFiles): Effect.Effect<ServerTlsOptions, TlsMaterialError> =>
  Effect.gen(function* () {
    const now = Date.now()
    const { cert, key } = yield* readPair(files.cert, files.key, now)
    const ca = files.clientCa === undefined ? undefined : (yield* readCertificates(files.clientCa)).pem
    yield* checkContext(files.cert, { cert, key })
    if (files.clientCa !== undefined && ca !== undefined) yield* checkContext(files.clientCa, { ca })
    return { cert, key, ca, requestCert: ca !== undefined, rejectUnauthorized: ca !== undefined }
  })

/** The files behind the consumer's TLS towards relays; each part is optional. */
interface ClientTlsFiles {
  readonly ca?: TlsFile | undefined
  readonly cert?: TlsFile | undefined
  readonly key?: TlsFile | undefined
}

/** Reads and checks the relay CA and the client certificate and key (given together or not at all). */
export const loadClientTls = (files: ClientTlsFiles): Effect.Effect<ClientTlsOptions, TlsMaterialError> =>
  Effect.gen(function* () {
    const ca = files.ca === undefined ? undefined : (yield* readCertificates(files.ca)).pem
    if (files.ca !== undefined && ca !== undefined) yield* checkContext(files.ca, { ca })
    if (files.cert === undefined || files.key === undefined) return { ca }
    const { cert, key } = yield* readPair(files.cert, files.key, Date.now())
    yield* checkContext(files.cert, { cert, key })
    return { ca, cert, key }
  })

/**
 * An `HttpClient` over undici whose connections use `tls` (the default trust store and no client
 * certificate when undefined). The agent closes with the layer.
 */
export const httpClientLayer = (tls?: ClientTlsOptions | undefined) =>
  tls === undefined || (tls.ca === undefined && tls.cert === undefined)
    ? NodeHttpClient.layerUndici
    : NodeHttpClient.layerUndiciWithoutDispatcher.pipe(
        Layer.provide(
          Layer.scoped(
            NodeHttpClient.Dispatcher,
            Effect.acquireRelease(
              Effect.sync(
                () =>
                  new Agent({
                    connect: {
                      ...(tls.ca === undefined ? {} : { ca: tls.ca }),
                      ...(tls.cert === undefined ? {} : { cert: tls.cert, key: tls.key })
                    }
                  })
              ),
              (agent) => Effect.promise(() => agent.destroy())
            )
          )
        )
      )
