export declare const WAT_PATH: string
export declare const GENERATED_PATH: string
export declare const buildXxh3Wasm: () => Promise<Uint8Array>
export declare const renderXxh3WasmModule: (bytes: Uint8Array) => string
