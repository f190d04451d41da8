/**
 * Synchronous instantiation of the CKF core's small WebAssembly modules (committed as base64 by
 * `npm run build:wasm`): no I/O, no promise, and `undefined` where the host cannot run them, so
 * each caller keeps its TypeScript path.
 */

/** The part of the WebAssembly JS API used here: the project's lib (ES2022, no DOM) lacks it. */
interface WasmApi {
  readonly Module: new (bytes: Uint8Array) => object
  readonly Instance: new (module: object, imports: object) => { readonly exports: object }
}

/** The memory every module exports. */
interface WasmMemory {
  readonly memory: { readonly buffer: ArrayBuffer; grow(pages: number): number }
}

const PAGE_BYTES = 65_536

const decodeBase64 = (text: string): Uint8Array => Uint8Array.from(atob(text), (c) => c.charCodeAt(0))

/**
 * The instance of the module in `base64` with its memory grown to at least `memoryBytes`, or
 * `undefined` when WebAssembly (or a feature the module uses, such as SIMD) is unavailable.
 */
export const instantiateWasm = <E extends WasmMemory>(base64: string, memoryBytes: number): E | undefined => {
  try {
    const api = (globalThis as unknown as { readonly WebAssembly?: WasmApi }).WebAssembly
    if (typeof api !== "object") return undefined
    const module = new api.Module(decodeBase64(base64))
    // The .wat fixes the exports' shapes, which the JS API cannot know.
    const exports = new api.Instance(module, {}).exports as E
    const have = exports.memory.buffer.byteLength
    if (have < memoryBytes) exports.memory.grow(Math.ceil((memoryBytes - have) / PAGE_BYTES))
    return exports
  } catch {
    return undefined
  }
}
