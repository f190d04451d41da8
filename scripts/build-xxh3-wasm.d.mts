export type WasmModuleName = "xxh3Long" | "xxh3Tokens" | "ckfProbe"
export declare const WASM_MODULES: Record<
  WasmModuleName,
  {
    readonly watPath: string
    readonly generatedPath: string
    readonly constant: string
    readonly title: string
  }
>
export declare const WAT_PATH: string
export declare const GENERATED_PATH: string
export declare const buildWasm: (name: WasmModuleName) => Promise<Uint8Array>
export declare const renderWasmModule: (name: WasmModuleName, bytes: Uint8Array) => string
export declare const buildXxh3Wasm: () => Promise<Uint8Array>
export declare const renderXxh3WasmModule: (bytes: Uint8Array) => string
