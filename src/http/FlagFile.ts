/**
 * Files named by command-line flags (TLS material, token files, discovery documents, the
 * simulator's outputs): the words a failed read or write is reported in, and the shape of the
 * errors that carry them, so that a startup check and the loader it runs ahead of word the same
 * failure the same way.
 */

import { type Cause, Data } from "effect"

/** Why a file operation failed, in words: the common `errno` codes named, anything else as thrown. */
export const fileErrorText = (cause: unknown): string => {
  const error = cause as { readonly code?: unknown; readonly message?: unknown } | undefined
  if (error?.code === "ENOENT") return "no such file"
  if (error?.code === "EACCES") return "permission denied"
  if (error?.code === "EISDIR") return "is a directory"
  return typeof error?.message === "string" ? error.message : String(cause)
}

/** What an error about a flag's file says: reported as `--flag: reason`. */
export interface FlagFileProblem {
  /** The flag that named the file (`--tls-cert`). */
  readonly flag: string
  readonly path: string
  readonly reason: string
}

/** The base of a tagged error about a flag's file; its message is `--flag: reason`. */
export const FlagFileError = <Tag extends string>(
  tag: Tag
): (new (
  problem: FlagFileProblem
) => Cause.YieldableError & { readonly _tag: Tag } & Readonly<FlagFileProblem>) =>
  class extends Data.TaggedError(tag)<FlagFileProblem> {
    override get message(): string {
      return `${this.flag}: ${this.reason}`
    }
  }
