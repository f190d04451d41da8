/**
 * TLS material made at test time with the `openssl` CLI, never checked in: a CA, a server
 * certificate for 127.0.0.1 and localhost (subjectAltName) and a client certificate signed by
 * it, and a second, unrelated CA with a client certificate of its own. Plus an HTTPS client on
 * `node:https` whose trust and client certificate each test chooses.
 */

import { execFileSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import * as Https from "node:https"
import { tmpdir } from "node:os"
import { join } from "node:path"

export const OPENSSL = "/usr/bin/openssl"

export interface TestPki {
  readonly dir: string
  readonly path: (name: string) => string
  readonly read: (name: string) => string
  readonly remove: () => void
}

const openssl = (dir: string, args: ReadonlyArray<string>): void => {
  execFileSync(OPENSSL, args, { cwd: dir, stdio: "pipe" })
}

const newKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]

const makeCa = (dir: string, name: string, cn: string): void =>
  openssl(dir, [
    "req",
    "-x509",
    ...newKey,
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.pem`,
    "-days",
    "2",
    "-subj",
    `/CN=${cn}`,
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign,cRLSign"
  ])

const makeLeaf = (dir: string, name: string, ca: string, cn: string, extensions: string): void => {
  openssl(dir, ["req", ...newKey, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${cn}`])
  writeFileSync(join(dir, `${name}.ext`), extensions)
  openssl(dir, [
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    `${ca}.pem`,
    "-CAkey",
    `${ca}.key`,
    "-set_serial",
    `0x${randomBytes(8).toString("hex")}`,
    "-days",
    "2",
    "-out",
    `${name}.pem`,
    "-extfile",
    `${name}.ext`
  ])
}

/**
 * `ca.pem`; `server.pem`/`server.key` (127.0.0.1, localhost); `client.pem`/`client.key` (by ca);
 * `other-ca.pem`; `other-client.pem`/`other-client.key` (by other-ca).
 */
export const makeTestPki = (): TestPki => {
  const dir = mkdtempSync(join(tmpdir(), "kvrelay-tls-"))
  makeCa(dir, "ca", "kvrelay test CA")
  makeLeaf(
    dir,
    "server",
    "ca",
    "localhost",
    "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
  )
  makeLeaf(dir, "client", "ca", "kvrelay-global", "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
  makeCa(dir, "other-ca", "unrelated test CA")
  makeLeaf(
    dir,
    "other-client",
    "other-ca",
    "stranger",
    "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
  )
  return {
    dir,
    path: (name) => join(dir, name),
    read: (name) => readFileSync(join(dir, name), "utf8"),
    remove: () => rmSync(dir, { recursive: true, force: true })
  }
}

export interface HttpsAnswer {
  readonly status: number
  readonly headers: Record<string, string | Array<string> | undefined>
  readonly text: string
}

export interface HttpsRequestOptions {
  readonly ca?: string | undefined
  readonly cert?: string | undefined
  readonly key?: string | undefined
  readonly method?: string
  readonly headers?: Record<string, string>
  readonly body?: string
  readonly timeoutMs?: number
}

/**
 * One request on a fresh connection (no agent pooling, so every test does its own handshake);
 * rejects with the TLS or socket error, or after `timeoutMs`.
 */
export const httpsRequest = (url: string, options: HttpsRequestOptions = {}): Promise<HttpsAnswer> =>
  new Promise((resolve, reject) => {
    const request = Https.request(
      url,
      {
        method: options.method ?? "GET",
        headers: options.headers,
        agent: false,
        ...(options.ca === undefined ? {} : { ca: options.ca }),
        ...(options.cert === undefined ? {} : { cert: options.cert, key: options.key })
      },
      (response) => {
        let text = ""
        response.setEncoding("utf8")
        response.on("data", (chunk: string) => {
          text += chunk
        })
        response.on("end", () =>
          resolve({ status: response.statusCode ?? 0, headers: response.headers, text })
        )
        response.on("error", reject)
      }
    )
    request.setTimeout(options.timeoutMs ?? 10_000, () =>
      request.destroy(new Error(`no answer within ${options.timeoutMs ?? 10_000} ms`))
    )
    request.on("error", reject)
    request.end(options.body)
  })

/** The error a request fails with (the test fails if it succeeds). */
export const httpsFailure = async (url: string, options: HttpsRequestOptions = {}): Promise<Error> => {
  try {
    const answer = await httpsRequest(url, options)
    throw new Error(`expected the request to fail, it answered ${answer.status}: ${answer.text}`)
  } catch (error) {
    if (error instanceof Error && error.message.startsWith("expected the request to fail")) throw error
    return error as Error
  }
}
