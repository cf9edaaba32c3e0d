// The switchyard/v1 Router config's zod schema and validateConfig.
// Validation collects every problem (with its field path) before failing, so a
// user fixes a file in one pass. docs/config.md documents each field;
// schema/switchyard-v1.schema.json is generated from `routerConfigSchema`
// (npm run schema). Why zod: see schema-kit.ts (transforms, cross-field
// refinements that still run when a field failed, our own messages, and JSON
// Schema output, all from one declaration). The types are in types.ts, the
// defaults and URL helpers in defaults.ts, the cross-field rules in rules.ts;
// this module re-exports them (the config's public face).
import { ConfigError, type ConfigIssue } from '../errors.js';
import { adminSchema } from './admin.js';
import { authSchema } from './auth.js';
import { rateLimitsSchema } from './rate-limits.js';
import { batchSchema, type BatchConfig } from './batch.js';
import { badUrlPort, CONTROL_CHARS, DEFAULT_FILTERS, DEFAULT_SCORERS, DEFAULTS, httpOrigin, safeName } from './defaults.js';
import { disaggregationSchema } from './disaggregation.js';
import { discoverySchema } from './discovery.js';
import { extProcSchema } from './extproc.js';
import { flowControlSchema } from './flow-control.js';
import { haSchema, type HaConfig } from './ha.js';
import { adapterLoadingSchema, adapterQueueSchema, modelRewritesSchema, poolAdaptersSchema } from './models.js';
import { filterSpec, scorerSpec } from './plugin-spec.js';
import { kvEventsEndpointSchema, poolPrefixSchema, tierWeightsSchema } from './prefix-mode.js';
import { responsesSchema, type ResponsesConfig } from './responses.js';
import { serverSchema } from './server.js';
import { crossFieldRules, type PluginCheck } from './rules.js';
import { ALWAYS, got, int, isMapping, listError, nonEmpty, num, oneOf, strict, toConfigIssues, z } from './schema-kit.js';
import { SESSION_DEFAULTS, sessionsSchema, type SessionsConfig } from './sessions.js';
import { tracingSchema } from './tracing.js';
import { ACCELERATORS, API_VERSION, ENGINES, LOG_LEVELS, ROLES, UPSTREAM_CLIENTS, type EndpointConfig, type RouterConfig } from './types.js';

export * from './types.js';
export * from './defaults.js';
export { PD_MODES, DEFAULT_DECODE_SCORERS, DEFAULT_PREFILL_FILTERS, DEFAULT_PREFILL_SCORERS, type DisaggregationConfig } from './disaggregation.js';
export type { AdminConfig } from './admin.js';
export type { AuthConfig, AuthKeyConfig } from './auth.js';
export type { LimitSpec, RateLimitsConfig } from './rate-limits.js';
export { FRONT_ENDS, SERVER_DEFAULTS, type ServerConfig } from './server.js';
export type { PluginSpec, ScorerSpec } from './plugin-spec.js';

// ---- the schema (zod 4; see schema-kit.ts for why zod).

const urlMessage = (s: unknown) => {
  // a bad port is named, with the range (new URL() refuses it, which would otherwise read as a bad URL shape)
  const port = typeof s === 'string' ? badUrlPort(s) : null;
  if (port !== null) return `port ${JSON.stringify(port)} is not a valid port: it must be an integer 1–65535, e.g. http://10.0.0.5:8000 (got ${got(s)})`;
  return `must be an http(s) URL with no path, query, fragment or credentials, e.g. http://10.0.0.5:8000 (got ${got(s)})`;
};

export const endpointConfigSchema = strict(
  {
    name: nonEmpty()
      .refine((s) => !CONTROL_CHARS.test(s), {
        error: (i) => `must not contain control characters (it is sent in the x-switchyard-endpoint header; got ${got(i.input)})`,
      })
      .optional()
      .describe('unique across all pools; default host:port of url'),
    url: nonEmpty()
      .transform((s, ctx) => {
        const origin = httpOrigin(s);
        if (origin === null) {
          ctx.addIssue({ code: 'custom', message: urlMessage(s), input: s });
          return z.NEVER;
        }
        if (new URL(origin).port === '0') {
          // a valid URL, but no engine listens on port 0 (every request would fail to connect)
          ctx.addIssue({ code: 'custom', message: `port 0 is not a port an engine listens on: it must be an integer 1–65535, e.g. http://10.0.0.5:8000 (got ${got(s)})`, input: s });
          return z.NEVER;
        }
        return origin;
      })
      .describe('http://host:port or https://host:port, no path, query, fragment or credentials'),
    role: oneOf(ROLES).default('both'),
    revision: nonEmpty().optional(),
    bootstrapPort: int(1, 65535).optional().describe("SGLang prefill endpoints: the engine's bootstrap port (default disaggregation.bootstrapPort)"),
    capacity: strict(
      { gpuBlocks: int(0, 2 ** 31 - 1).default(0), cpuBlocks: int(0, 2 ** 31 - 1).default(0), diskBlocks: int(0, 2 ** 31 - 1).default(0) },
      'must be a mapping',
    )
      .optional()
      .describe('prefix-index blocks (of scheduling.prefixBlockSize bytes) per tier; default: learnt from the engine'),
    kvEvents: kvEventsEndpointSchema.optional().describe("the engine's KV-event publisher (pools with prefix.mode precise)"),
  },
  'must be a mapping',
).transform((e): EndpointConfig => ({
  name: e.name ?? safeName(e.url),
  url: e.url,
  role: e.role,
  ...(e.revision ? { revision: e.revision } : {}),
  ...(e.bootstrapPort !== undefined ? { bootstrapPort: e.bootstrapPort } : {}),
  ...(e.capacity ? { capacity: e.capacity } : {}),
  ...(e.kvEvents ? { kvEvents: e.kvEvents } : {}),
}));

const poolSchema = strict(
  {
    name: nonEmpty(),
    engine: oneOf(ENGINES).default('vllm'),
    accelerator: oneOf(ACCELERATORS).default('nvidia'),
    models: z
      .array(nonEmpty(), { error: listError })
      .min(1, { error: 'must list at least one model' })
      .superRefine((models, ctx) => {
        // listed twice, each endpoint of the pool would be a candidate twice for the model
        const seen = new Set<unknown>();
        models.forEach((m, j) => {
          if (typeof m === 'string' && m !== '' && seen.has(m)) ctx.addIssue({ code: 'custom', path: [j], message: `duplicate model "${m}" in this pool`, input: m });
          seen.add(m);
        });
      }, ALWAYS),
    // at least one unless the pool has discovery (checked in crossFieldRules)
    endpoints: z.array(endpointConfigSchema, { error: listError }).default([]),
    batchLimit: int(1, 65_536)
      .optional()
      .describe("requests each endpoint runs at once (vLLM --max-num-seqs, SGLang --max-running-requests); default: learned from the engine's running/waiting counts"),
    prefix: poolPrefixSchema.describe('prefix matching of this pool (docs/prefix-index.md)'),
    speed: strict(
      {
        prefillCostFactor: num(0.01, 1000).optional().describe('multiplies the reference per-token prefill cost; default: the accelerator profile\'s'),
        decodeCostFactor: num(0.01, 1000).optional().describe('multiplies the reference inter-token latency; default: the accelerator profile\'s'),
      },
      'must be a mapping {prefillCostFactor, decodeCostFactor}',
    )
      .optional()
      .describe("the pool's speed against the reference: seeds the latency model of its endpoints"),
    cost: num(0, 1e6).optional().describe("relative cost of one endpoint per unit of time; default: the accelerator profile's"),
    discovery: discoverySchema.optional().describe('endpoints from Kubernetes pods (docs/operations.md); absent = the endpoints list only'),
    upstreamAuth: z
      .string({ error: 'must be the name of an environment variable' })
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, { error: 'must be the name of an environment variable (letters, digits, _)' })
      .optional()
      .describe("name of an environment variable holding the engines' API key: sent as Authorization: Bearer to this pool's endpoints"),
    adapters: poolAdaptersSchema,
    adapterLoading: adapterLoadingSchema,
  },
  'must be a mapping',
);

const schedulingSchema = strict(
  {
    filters: z
      .array(filterSpec, { error: listError })
      .default(() => DEFAULT_FILTERS.map((s) => ({ ...s, params: { ...s.params } })))
      .describe('applied in order; a type name or {type, params}'),
    scorers: z
      .array(scorerSpec, { error: listError })
      .default(() => DEFAULT_SCORERS.map((s) => ({ ...s, params: { ...s.params } })))
      .describe('{type, weight, params}; [] = no scoring'),
    picker: filterSpec.default(() => ({ type: DEFAULTS.scheduling.picker, params: {} })),
    prefixBlockSize: int(1, 1 << 20).default(DEFAULTS.scheduling.prefixBlockSize).describe('bytes per prefix-index block'),
    tierWeights: tierWeightsSchema,
  },
  'must be a mapping',
).prefault({});

const d = DEFAULTS.dataLayer;
const dataLayerSchema = strict(
  {
    scrapeIntervalMs: int(0, 3_600_000).default(d.scrapeIntervalMs),
    staleAfterMs: int(1, 3_600_000).default(d.staleAfterMs).describe('the one staleness setting: metrics older than this are ignored by scorers and flow control'),
    healthIntervalMs: int(0, 3_600_000).default(d.healthIntervalMs),
    healthTimeoutMs: int(1, 3_600_000).default(d.healthTimeoutMs),
    breakerFailures: int(1, 1_000_000).default(d.breakerFailures),
    breakerCooldownMs: int(1, 3_600_000).default(d.breakerCooldownMs),
    modelCheckIntervalMs: int(0, 86_400_000)
      .default(d.modelCheckIntervalMs)
      .describe("how often each endpoint's GET /v1/models is read: an endpoint that does not list a model of its pool is not ready for it (0: never)"),
  },
  'must be a mapping',
).prefault({});

const p = DEFAULTS.proxy;
const proxySchema = strict(
  {
    client: oneOf(UPSTREAM_CLIENTS).default(p.client),
    maxRetries: int(0, 10).default(p.maxRetries),
    connectionsPerEndpoint: int(1, 65536).default(p.connectionsPerEndpoint),
    connectTimeoutMs: int(1, 3_600_000).default(p.connectTimeoutMs),
    headersTimeoutMs: int(1, 86_400_000).default(p.headersTimeoutMs),
    bodyTimeoutMs: int(0, 86_400_000).default(p.bodyTimeoutMs),
  },
  'must be a mapping',
).prefault({});

/** What a user writes in a switchyard/v1 Router config (the published JSON Schema is generated from it). */
export const routerConfigSchema = strict(
  {
    apiVersion: z.literal(API_VERSION, { error: (i) => `must be "${API_VERSION}" (got ${got(i.input)})` }),
    kind: z.literal('Router', { error: (i) => `must be "Router" (got ${got(i.input)})` }),
    listen: strict(
      { host: nonEmpty().default(DEFAULTS.listen.host), port: int(0, 65535).default(DEFAULTS.listen.port) },
      'must be a mapping',
    ).prefault({}),
    pools: z.array(poolSchema, { error: listError }).min(1, { error: 'must list at least one pool' }),
    scheduling: schedulingSchema,
    dataLayer: dataLayerSchema,
    proxy: proxySchema,
    server: serverSchema.describe('the HTTP front end and its connection limits (docs/front-end.md)'),
    limits: strict(
      {
        maxBodyBytes: int(1, 2 ** 31 - 1).default(DEFAULTS.limits.maxBodyBytes),
        requestBodyTimeoutMs: int(1, 3_600_000).default(DEFAULTS.limits.requestBodyTimeoutMs),
        maxJsonDepth: int(1, 10_000).default(DEFAULTS.limits.maxJsonDepth).describe('deepest nesting of arrays/objects in a request body'),
        parseOffloadBytes: int(0, 2 ** 31 - 1)
          .default(DEFAULTS.limits.parseOffloadBytes)
          .describe('bodies larger than this are parsed in a worker thread (0: every body)'),
        parseWorkers: int(1, 64).default(DEFAULTS.limits.parseWorkers).describe('worker threads for parsing large bodies'),
        bodyScan: oneOf(['native', 'javascript'] as const)
          .default(DEFAULTS.limits.bodyScan)
          .describe('how an inference body is read: the native scan (JSON.parse only for bodies it refuses) or JSON.parse always'),
      },
      'must be a mapping',
    ).prefault({}),
    logging: strict(
      {
        level: oneOf(LOG_LEVELS).default(DEFAULTS.logging.level),
        access: z.boolean({ error: (i) => `must be true or false (got ${got(i.input)})` }).default(DEFAULTS.logging.access).describe('one info line per finished request (no keys, no bodies)'),
        accessSample: z
          .number({ error: (i) => `must be a number in [0, 1] (got ${got(i.input)})` })
          .min(0, { error: 'must be a number in [0, 1]' })
          .max(1, { error: 'must be a number in [0, 1]' })
          .default(DEFAULTS.logging.accessSample)
          .describe('the share of requests the access log writes'),
      },
      'must be a mapping',
    ).prefault({}),
    shutdown: strict(
      {
        graceMs: int(0, 86_400_000).default(DEFAULTS.shutdown.graceMs).describe('how long in-flight requests get to finish after SIGTERM/SIGINT'),
        drainDelayMs: int(0, 600_000).default(DEFAULTS.shutdown.drainDelayMs).describe('after the signal, keep accepting this long with /readyz at 503 (balancers notice)'),
      },
      'must be a mapping',
    ).prefault({}),
    metrics: strict(
      {
        maxLabelValues: int(1, 1_000_000)
          .default(1000) // as src/metrics/label-cap.ts's default
          .describe('distinct values of a tenant or flow label; later ones are counted under (overflow)'),
      },
      'must be a mapping',
    )
      .prefault({})
      .describe('bounds on the metric series (docs/observability.md)'),
    tracing: tracingSchema.describe('OpenTelemetry tracing over OTLP (docs/observability.md); off by default'),
    flowControl: flowControlSchema.optional().describe('flow control (docs/flow-control.md); absent = first come, first served'),
    sessions: sessionsSchema.describe('conversations: identification, pins to endpoints, turn priority (docs/responses.md)'),
    responses: responsesSchema.describe('the Responses API and its store (docs/responses.md)'),
    disaggregation: disaggregationSchema.optional().describe('prefill/decode disaggregation (docs/disaggregation.md); absent = off'),
    admin: adminSchema.optional().describe('the admin API on its own listener (docs/operations.md); absent = none'),
    auth: authSchema.optional().describe('API keys → tenants, model allow-lists, band ceilings (docs/security.md); absent = no authentication'),
    rateLimits: rateLimitsSchema.optional().describe('requests and tokens per minute, tokens per UTC day, per tenant and per key (docs/security.md); absent = none'),
    ha: haSchema.optional().describe('several router replicas: active-active sharing routing state through Redis, or a standby pair over a lease (docs/operations.md); absent = a single router'),
    extProc: extProcSchema.optional().describe('Envoy ext_proc endpoint-picker listener (docs/operations.md); absent = none'),
    batch: batchSchema.optional().describe('the async processor over a Redis stream (docs/batch.md); absent = off'),
    modelRewrites: modelRewritesSchema,
    adapterQueue: adapterQueueSchema,
  },
  'the config must be a YAML mapping',
  'unknown top-level field',
);

/**
 * A YAML key with no value (`listen:`) is null: outside flowControl and
 * plugin params (whose own rules decide), null means absent.
 */
function dropNulls(v: unknown, top = true): unknown {
  if (Array.isArray(v)) return v.map((x) => dropNulls(x, false));
  if (!isMapping(v)) return v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) {
    if (x === null) continue;
    out[k] = (top && k === 'flowControl') || k === 'params' ? x : dropNulls(x, false);
  }
  return out;
}

/**
 * Validates a parsed config document and fills defaults. Throws ConfigError
 * listing every problem. `validatePlugin` (optional) checks plugin types and
 * parameters against the registry and returns problems as messages.
 */
/**
 * Session pins live where the replicas share state: with `responses.store`
 * on Redis and no `sessions.store` given, pins and turn ends go to the same
 * Redis; failing that, with active-active replicas (`ha.mode:
 * active-active`), to `ha.redis` (so a conversation continued through
 * another router replica keeps its pin and its turn state). An explicit
 * `sessions.store` (memory included) wins.
 */
function sessionsFollowingShared(doc: unknown, sessions: SessionsConfig, responses: ResponsesConfig, ha: HaConfig | undefined): SessionsConfig {
  const given = isMapping(doc) && isMapping((doc as Record<string, unknown>).sessions) && ((doc as Record<string, Record<string, unknown>>).sessions).store !== undefined;
  if (given) return sessions;
  const url = responses.store.type === 'redis' && responses.store.url !== undefined ? responses.store.url : ha?.mode === 'active-active' ? ha.redis : undefined;
  if (url === undefined) return sessions;
  return { ...sessions, store: { url, keyPrefix: SESSION_DEFAULTS.keyPrefix, timeoutMs: SESSION_DEFAULTS.timeoutMs } };
}

/**
 * With `auth`, identity comes from its keys and its trustHeaders: the flow
 * control block's plain-text keys (`tenants`) and its trustHeaders would be a
 * second, weaker identity, so they are refused with the field paths.
 */
function authWithFlowControl(fc: unknown, source?: string): void {
  if (!isMapping(fc)) return;
  const issues: ConfigIssue[] = [];
  if (isMapping(fc.tenants) && Object.keys(fc.tenants).length > 0)
    issues.push({ path: 'flowControl.tenants', message: 'plain-text keys cannot be used with an auth block: give the keys as SHA-256 digests in auth.keys (docs/security.md)' });
  if (fc.trustHeaders !== undefined && fc.trustHeaders !== null)
    issues.push({ path: 'flowControl.trustHeaders', message: 'with an auth block, identity headers are believed by auth.trustHeaders: set it there' });
  if (issues.length > 0) throw new ConfigError(issues, source);
}

export function validateConfig(doc: unknown, validatePlugin?: PluginCheck, source?: string): RouterConfig {
  if (!isMapping(doc)) throw new ConfigError([{ path: '', message: 'the config must be a YAML mapping' }], source);
  const r = routerConfigSchema.superRefine(crossFieldRules<z.output<typeof routerConfigSchema>>(validatePlugin), ALWAYS).safeParse(dropNulls(doc));
  if (!r.success) throw new ConfigError(toConfigIssues(r.error.issues), source);
  const v = r.data;
  if (v.auth !== undefined) authWithFlowControl(doc.flowControl, source);
  const cfg: RouterConfig = {
    apiVersion: API_VERSION,
    kind: 'Router',
    listen: v.listen,
    pools: v.pools,
    scheduling: v.scheduling,
    dataLayer: v.dataLayer,
    proxy: v.proxy,
    server: v.server,
    limits: v.limits,
    logging: v.logging,
    shutdown: v.shutdown,
    sessions: sessionsFollowingShared(doc, v.sessions, v.responses, v.ha),
    responses: v.responses,
    tracing: v.tracing,
    metrics: v.metrics,
    adapterQueue: v.adapterQueue,
  };
  if (v.flowControl !== undefined) cfg.flowControl = v.flowControl;
  if (v.admin !== undefined) cfg.admin = v.admin;
  if (v.auth !== undefined) cfg.auth = v.auth;
  if (v.rateLimits !== undefined) cfg.rateLimits = v.rateLimits;
  if (v.disaggregation !== undefined) cfg.disaggregation = v.disaggregation;
  // prefill endpoints without the block: the block's defaults apply (a prefill endpoint never takes a
  // request outside a disaggregated pair, so without them it would sit idle: docs/disaggregation.md)
  else if (v.pools.some((p) => p.endpoints.some((e) => e.role === 'prefill'))) cfg.disaggregation = disaggregationSchema.parse({});
  if (v.ha !== undefined) cfg.ha = v.ha;
  if (v.extProc !== undefined) cfg.extProc = v.extProc;
  if (v.modelRewrites.length > 0) cfg.modelRewrites = v.modelRewrites as RouterConfig['modelRewrites'];
  if (v.batch !== undefined) cfg.batch = { ...v.batch, consumer: v.batch.consumer ?? '', checkIntervalMs: v.batch.checkIntervalMs ?? v.dataLayer.scrapeIntervalMs } as BatchConfig;
  return cfg;
}

