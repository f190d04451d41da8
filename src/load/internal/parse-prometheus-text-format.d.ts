// The package ships no types: the shape its README documents (prom2json's), as the tests declare it too.
declare module "parse-prometheus-text-format" {
  export interface ParsedSample {
    readonly value?: string
    readonly labels?: Readonly<Record<string, string>>
    readonly buckets?: Readonly<Record<string, string>>
    readonly count?: string
    readonly sum?: string
  }
  export interface ParsedFamily {
    readonly name: string
    readonly help: string
    readonly type: "COUNTER" | "GAUGE" | "HISTOGRAM" | "SUMMARY" | "UNTYPED"
    readonly metrics: ReadonlyArray<ParsedSample>
  }
  export default function parsePrometheusTextFormat(text: string): Array<ParsedFamily>
}
