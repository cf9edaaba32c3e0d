// The `disaggregation` block of the router config: prefill/decode
// disaggregation (docs/disaggregation.md), its mode, threshold and the prefill
// and decode scheduling profiles. Type, defaults and zod schema; schema.ts adds
// it to the Router config.
import { DEFAULT_PICKER, filterSpec, scorerSpec, type PluginSpec, type ScorerSpec } from './plugin-spec.js';
import { int, listError, oneOf, strict, z } from './schema-kit.js';

export const PD_MODES = ['auto', 'nixl', 'sglang'] as const;

export interface DisaggregationConfig {
  /** nixl: prefill then decode (vLLM); sglang: both at once with bootstrap fields; auto: by the pool's engine. */
  mode: (typeof PD_MODES)[number];
  /** Disaggregate when the prompt's uncached tokens on the chosen decode endpoint reach this. */
  thresholdTokens: number;
  /** A prefill leg that has not answered by then is abandoned: the decode endpoint prefills itself. */
  prefillTimeoutMs: number;
  /** SGLang bootstrap port of the prefill engines. */
  bootstrapPort: number;
  /** The prefill profile (the decode leg uses `scheduling`). */
  prefill: { filters: PluginSpec[]; scorers: ScorerSpec[]; picker: PluginSpec };
  /** The decode profile: scorers and picker of the decode pick in pools with prefill endpoints (absent: `scheduling`'s). */
  decode?: { scorers: ScorerSpec[]; picker: PluginSpec };
}

export const DISAGGREGATION_DEFAULTS = { thresholdTokens: 256, prefillTimeoutMs: 30_000, bootstrapPort: 8998 };

export const DEFAULT_PREFILL_FILTERS: PluginSpec[] = [
  { type: 'model', params: {} },
  { type: 'healthy', params: {} },
  { type: 'role', params: { roles: ['prefill'], preferBoth: false } },
];
export const DEFAULT_DECODE_SCORERS: ScorerSpec[] = [
  { type: 'kv-cache-utilization', weight: 2, params: {} },
  { type: 'running-requests', weight: 2, params: {} },
];
export const DEFAULT_PREFILL_SCORERS: ScorerSpec[] = [
  { type: 'prefix-cache', weight: 3, params: {} },
  { type: 'queue', weight: 2, params: {} },
];

export const disaggregationSchema = strict(
  {
    mode: oneOf(PD_MODES).default('auto').describe('nixl (vLLM, sequential), sglang (bootstrap, both legs at once), auto (by pool engine)'),
    thresholdTokens: int(0, 10_000_000)
      .default(DISAGGREGATION_DEFAULTS.thresholdTokens)
      .describe("disaggregate when the prompt's uncached tokens on the chosen decode endpoint reach this"),
    prefillTimeoutMs: int(1, 3_600_000).default(DISAGGREGATION_DEFAULTS.prefillTimeoutMs),
    bootstrapPort: int(1, 65535).default(DISAGGREGATION_DEFAULTS.bootstrapPort),
    prefill: strict(
      {
        filters: z
          .array(filterSpec, { error: listError })
          .default(() => DEFAULT_PREFILL_FILTERS.map((s) => ({ ...s, params: { ...s.params } }))),
        scorers: z
          .array(scorerSpec, { error: listError })
          .default(() => DEFAULT_PREFILL_SCORERS.map((s) => ({ ...s, params: { ...s.params } }))),
        picker: filterSpec.default(() => ({ type: DEFAULT_PICKER, params: {} })),
      },
      'must be a mapping',
    )
      .prefault({})
      .describe('the prefill profile: filters, scorers, picker (the decode leg uses scheduling)'),
    decode: strict(
      {
        scorers: z
          .array(scorerSpec, { error: listError })
          .default(() => DEFAULT_DECODE_SCORERS.map((s) => ({ ...s, params: { ...s.params } }))),
        picker: filterSpec.default(() => ({ type: DEFAULT_PICKER, params: {} })),
      },
      'must be a mapping',
    )
      .optional()
      .describe("the decode profile: scorers and picker of decode picks in pools with prefill endpoints (filters: scheduling's); absent: scheduling's scorers"),
  },
  'must be a mapping',
);
