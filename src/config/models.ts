// Model-aware traffic in the config: LoRA adapters a pool declares (beside
// those its engines list in /v1/models), on-demand adapter loading, and the
// model rewrites (weighted targets, sticky per session). docs/models.md.
import { ALWAYS, int, isMapping, listError, nonEmpty, num, strict, z } from './schema-kit.js';

/** An adapter a pool declares: its base model (default: the pool's first) and the path a load sends. */
export interface AdapterConfig {
  name: string;
  /** The pool's model it adapts (default: the pool's first model). */
  base?: string;
  /** `lora_path` of POST /v1/load_lora_adapter (default: the name). */
  path?: string;
}

export interface AdapterLoadingConfig {
  /** Ask an engine to load an adapter it lacks (POST /v1/load_lora_adapter) and route there once it has. */
  enabled: boolean;
  /** How long a load may take before the request goes elsewhere (or is a 503). */
  timeoutMs: number;
  /** After a refused or failed load, that engine is not asked for that adapter again for this long. */
  retryAfterMs: number;
}

export const ADAPTER_LOADING_DEFAULTS: AdapterLoadingConfig = { enabled: false, timeoutMs: 30_000, retryAfterMs: 30_000 };

const adapterSchema = z.union(
  [
    nonEmpty().transform((name) => ({ name })),
    strict(
      {
        name: nonEmpty(),
        base: nonEmpty().optional().describe("the pool's model it adapts (default: the pool's first model)"),
        path: nonEmpty().optional().describe('lora_path sent when the router loads it (default: the name)'),
      },
      'must be an adapter name or a mapping {name, base, path}',
    ),
  ],
  { error: 'must be an adapter name or a mapping {name, base, path}' },
);

export const poolAdaptersSchema = z
  .array(adapterSchema, { error: listError })
  .optional()
  .describe("LoRA adapters of this pool's models, known before any engine lists them (engines' /v1/models adds the rest)");

export const adapterLoadingSchema = strict(
  {
    enabled: z.boolean({ error: 'must be true or false' }).default(ADAPTER_LOADING_DEFAULTS.enabled),
    timeoutMs: int(1, 3_600_000).default(ADAPTER_LOADING_DEFAULTS.timeoutMs).describe('longest wait for a load'),
    retryAfterMs: int(0, 86_400_000).default(ADAPTER_LOADING_DEFAULTS.retryAfterMs).describe('after a refused load, how long that engine is not asked for that adapter again'),
  },
  'must be a mapping {enabled, timeoutMs, retryAfterMs}',
)
  .optional()
  .describe("load an adapter on an engine that lacks it (vLLM's POST /v1/load_lora_adapter); absent = off");

/**
 * The router-side hold for adapter requests (docs/models.md, "When no slot is
 * free"): a request for an adapter whose every candidate engine has all its
 * GPU adapter slots taken by other adapters' requests waits in the router,
 * FIFO per adapter, until a slot frees or the adapter runs somewhere; bounded
 * in requests, bytes and time.
 */
export interface AdapterQueueConfig {
  enabled: boolean;
  /** Requests held at once for one adapter. */
  maxPerAdapter: number;
  /** Requests held at once over every adapter. */
  maxRequests: number;
  /** Bytes the held requests' bodies (and their prompt copies) may take together. */
  maxBytes: number;
  /** Longest wait in the hold; then 503 with Retry-After. */
  maxWaitMs: number;
  /** Retry-After (seconds) of the hold's 503s. */
  retryAfterSeconds: number;
}

export const ADAPTER_QUEUE_DEFAULTS: AdapterQueueConfig = {
  enabled: true,
  maxPerAdapter: 256,
  maxRequests: 4096,
  maxBytes: 256 * 1024 * 1024,
  maxWaitMs: 30_000,
  retryAfterSeconds: 1,
};

const aq = ADAPTER_QUEUE_DEFAULTS;
export const adapterQueueSchema = strict(
  {
    enabled: z.boolean({ error: 'must be true or false' }).default(aq.enabled).describe('hold adapter requests in the router while no candidate engine has a free adapter slot'),
    maxPerAdapter: int(1, 1_000_000).default(aq.maxPerAdapter).describe('requests held at once for one adapter; beyond: 503'),
    maxRequests: int(1, 10_000_000).default(aq.maxRequests).describe('requests held at once over every adapter; beyond: 503'),
    maxBytes: int(1, 2 ** 40).default(aq.maxBytes).describe('bytes of the held requests\' bodies together; beyond: 503'),
    maxWaitMs: int(1, 86_400_000).default(aq.maxWaitMs).describe('longest wait in the hold; then 503 with Retry-After'),
    retryAfterSeconds: int(0, 86_400).default(aq.retryAfterSeconds).describe('Retry-After of the hold\'s 503s (0: none)'),
  },
  'must be a mapping {enabled, maxPerAdapter, maxRequests, maxBytes, maxWaitMs, retryAfterSeconds}',
)
  .prefault({})
  .describe('the router-side hold of adapter requests while every candidate engine\'s adapter slots are taken (docs/models.md)');

export interface RewriteTarget {
  model: string;
  weight: number;
}

export interface RewriteRule {
  /** The requested model name it applies to; absent with `default`. */
  model?: string;
  /** Applies to requests that name no model. */
  default: boolean;
  targets: RewriteTarget[];
}

const targetSchema = strict(
  {
    model: nonEmpty(),
    weight: num(0, 1_000_000),
  },
  'must be a mapping {model, weight}',
);

const ruleSchema = strict(
  {
    model: nonEmpty().optional().describe('the requested model name this rule rewrites (exact)'),
    default: z.boolean({ error: 'must be true or false' }).default(false).describe('the rule for requests without a model'),
    targets: z.array(targetSchema, { error: listError }).min(1, { error: 'must list at least one target' }),
  },
  'must be a mapping {model | default, targets}',
).superRefine((r, ctx) => {
  if ((r.model === undefined) === (r.default !== true))
    ctx.addIssue({ code: 'custom', path: [], message: 'give either model (the requested name) or default: true (requests without one)', input: r });
  if (Array.isArray(r.targets) && r.targets.length > 0) {
    const sum = r.targets.reduce((s, t) => s + (typeof t?.weight === 'number' ? t.weight : 0), 0);
    if (!(sum > 0)) ctx.addIssue({ code: 'custom', path: ['targets'], message: 'the weights must sum to a positive number', input: r.targets });
    const seen = new Set<string>();
    r.targets.forEach((t, j) => {
      if (typeof t?.model !== 'string') return;
      if (seen.has(t.model)) ctx.addIssue({ code: 'custom', path: ['targets', j, 'model'], message: `"${t.model}" is listed twice`, input: t.model });
      seen.add(t.model);
    });
    if (r.model !== undefined && r.targets.every((t) => t?.model === r.model))
      ctx.addIssue({ code: 'custom', path: ['targets'], message: `rewrites "${r.model}" to itself only`, input: r.targets });
  }
}, ALWAYS);

export const modelRewritesSchema = z
  .array(ruleSchema, { error: listError })
  .default(() => [])
  .describe('rules that send shares of a model name\'s traffic to other models (docs/models.md)');

/**
 * Rules across pools and rewrites: an adapter's base among its pool's models
 * and its name no model's, one rule per model name, a target some pool serves
 * (a model or a declared adapter) and no target another rule rewrites (a
 * rewrite applies once: a chain or a loop is a mistake).
 */
export function modelRules(v: Record<string, unknown>, add: (path: PropertyKey[], message: string) => void): void {
  const pools: unknown[] = Array.isArray(v.pools) ? v.pools : [];
  const models = new Set<string>();
  for (const p of pools) if (isMapping(p) && Array.isArray(p.models)) for (const m of p.models) if (typeof m === 'string') models.add(m);
  const adapters = new Map<string, string>();
  pools.forEach((p, i) => {
    if (!isMapping(p) || !Array.isArray(p.adapters)) return;
    const own: unknown[] = Array.isArray(p.models) ? p.models : [];
    p.adapters.forEach((a, j) => {
      const name = typeof a === 'string' ? a : isMapping(a) && typeof a.name === 'string' ? a.name : '';
      if (name === '') return;
      const base = isMapping(a) && typeof a.base === 'string' ? a.base : undefined;
      if (base !== undefined && !own.includes(base))
        add(['pools', i, 'adapters', j, 'base'], `"${base}" is not a model of this pool (its models: ${own.map((m) => JSON.stringify(m)).join(', ')})`);
      if (models.has(name)) add(['pools', i, 'adapters', j], `"${name}" is a model name: an adapter needs a name of its own`);
      else if (adapters.has(name) && adapters.get(name) !== (base ?? own[0])) add(['pools', i, 'adapters', j], `adapter "${name}" is declared for another base model elsewhere`);
      adapters.set(name, (base ?? own[0]) as string);
    });
  });
  const rules: unknown[] = Array.isArray(v.modelRewrites) ? v.modelRewrites : [];
  const ruled = new Map<string, number>();
  let defaultAt = -1;
  rules.forEach((r, i) => {
    if (!isMapping(r)) return;
    if (r.default === true) {
      if (defaultAt >= 0) add(['modelRewrites', i, 'default'], `a second default rule (the first is modelRewrites[${defaultAt}])`);
      else defaultAt = i;
    }
    if (typeof r.model !== 'string') return;
    if (ruled.has(r.model)) add(['modelRewrites', i, 'model'], `a second rule for "${r.model}" (the first is modelRewrites[${ruled.get(r.model)}])`);
    else ruled.set(r.model, i);
  });
  rules.forEach((r, i) => {
    if (!isMapping(r) || !Array.isArray(r.targets)) return;
    r.targets.forEach((t, j) => {
      if (!isMapping(t) || typeof t.model !== 'string') return;
      if (!models.has(t.model) && !adapters.has(t.model)) add(['modelRewrites', i, 'targets', j, 'model'], `no pool serves "${t.model}" (not a model of a pool, nor a declared adapter)`);
      const other = ruled.get(t.model);
      if (other !== undefined && other !== i) add(['modelRewrites', i, 'targets', j, 'model'], `"${t.model}" is rewritten by modelRewrites[${other}]: rewrites apply once, so a chain or loop is refused`);
    });
  });
}
