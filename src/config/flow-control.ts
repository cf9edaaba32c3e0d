// The `flowControl` block of the router config: types, defaults and its zod
// schema. It lives in config/ so the router config validates it with the rest
// (config/ imports nothing of ours); src/flow/config.ts re-exports it for the
// flow-control layer. docs/flow-control.md documents each field.
import { ALWAYS, isMapping, rawSegment, removedField, toConfigIssues, z } from './schema-kit.js';

export const DEFAULT_BANDS = ['premium', 'standard', 'best-effort', 'batch'] as const;

/**
 * `probabilistic`: hold while the band's backlog can drain within the TTL at the
 * measured drain rate, shed with a probability that rises only with sustained
 * overload (queue sojourn above `target` for `interval`); `utilisation`: the
 * rule before it (shed lower bands above maxUtilisation by instantaneous
 * utilisation, every one at 1); `off`: never shed (queue limits and the TTL still apply).
 */
export type AdmissionMode = 'probabilistic' | 'utilisation' | 'off';

export interface AdmissionConfig {
  mode: AdmissionMode;
  maxUtilisation: number;
  shedding: SheddingMode;
  /** Queue sojourn (the oldest waiting request's age in a band) above which a band may be overloaded (mode probabilistic). */
  targetMs: number;
  /** How long the sojourn must stay above `targetMs` before the band sheds (mode probabilistic). */
  intervalMs: number;
  /**
   * How long a band's peak in-flight count is remembered: a lower band's
   * request starts only while the slots the bands above it used in that
   * window and have released stay free (0: no such reserve).
   */
  reserveWindowMs: number;
}

/** Who is shed when a band must shed: the flow furthest over its fair share (`fair`), or the arriving request (`arrival`, flow-blind). */
export type SheddingMode = 'fair' | 'arrival';

/** What fairness inside a band counts: estimated tokens of work (`tokens`) or requests (`requests`). */
export type FairnessMode = 'tokens' | 'requests';

export interface FairnessConfig {
  /** The mode of every band not named in `bands`. */
  mode: FairnessMode;
  /** Per-band overrides. */
  bands: Record<string, FairnessMode>;
  /** Output estimate of a request with no max_tokens from a flow whose output is not learnt yet. */
  defaultOutputTokens: number;
  /**
   * Sparse flows first: a flow that becomes active not ahead of its band's
   * virtual time is dispatched ahead of the band's backlogged flows for this
   * many requests' worth (× the band's mean request cost) of work; 0 = off.
   */
  newFlowQuantum: number;
}

export interface TurnPriorityConfig {
  /** Continuation requests go ahead of cold ones inside their band. */
  enabled: boolean;
  /** Longest time a cold request is passed over by continuations before it goes first. */
  maxColdWaitMs: number;
}

export interface FlowSpec {
  /** Fairness id, e.g. `tenant:payments` or `workload:nightly-batch`. */
  id: string;
  /** The highest band this flow's requests may use. */
  priority: string;
  /** Floor on this flow's share of dispatches inside its band while it has demand, in [0, 1]. */
  minShare: number;
}

export interface QueueLimits {
  /** Requests queued; Infinity = no limit. */
  maxRequests: number;
  /** Request body bytes queued; Infinity = no limit. */
  maxBytes: number;
}

export interface SaturationConfig {
  /** An endpoint with this many engine-reported waiting requests is saturated. */
  queueDepthThreshold: number;
  /** An endpoint whose KV-cache usage reaches this fraction is saturated. */
  kvThreshold: number;
  /** An endpoint with this many router in-flight requests is saturated (also the cap when metrics are stale). */
  maxConcurrency: number;
  /**
   * An endpoint with this many uncached prompt tokens dispatched by the router
   * and not yet answered with a first byte (its prefill backlog, scaled by its
   * pool's prefillCostFactor) is saturated, while at least two such requests
   * are out there (one prefilling, one queued). Only streamed requests and
   * one-token answers are counted (a non-streamed answer's first byte comes
   * after its decode). 0 = the term is off.
   */
  prefillBacklogTokens: number;
}

export interface FlowControlConfig {
  enabled: boolean;
  /** Band names, highest priority first. */
  bands: string[];
  /** Band of flows not declared in `flows`. */
  defaultBand: string;
  flows: FlowSpec[];
  admission: AdmissionConfig;
  /** What fairness inside a band counts (docs/flow-control.md, "Cost fairness"). */
  fairness: FairnessConfig;
  /** Continuations of active conversations ahead of cold requests, with aging. */
  turnPriority: TurnPriorityConfig;
  limits: QueueLimits & { bands: Record<string, QueueLimits> };
  /** How long a request may wait in the queue before it is rejected. */
  ttlMs: number;
  /** How often queued requests are checked for expiry. */
  sweepIntervalMs: number;
  /** Retry-After (seconds) sent with 429 rejections. */
  retryAfterSeconds: number;
  saturation: SaturationConfig;
  /** API key (the token after `Bearer `) -> tenant id. */
  tenants: Record<string, string>;
  /**
   * Take identity from `x-tenant-id` (and `tenant:` ids in other headers) and
   * let identity headers raise a request's band. Default: true without
   * `tenants`, false with them (identity then comes from the API key).
   */
  trustHeaders: boolean;
  /** Queue slots (flow x band) tracked individually; further flows share one overflow queue per band. */
  maxFlows: number;
  /** Records per native queue (rounded up to a power of two). */
  queueCapacity: number;
}

export const FLOW_DEFAULTS = {
  ttlMs: 60_000,
  sweepIntervalMs: 250,
  retryAfterSeconds: 1,
  maxUtilisation: 0.85,
  /** CoDel-style sustained-overload detection (admission.target, admission.interval). */
  admissionTargetMs: 1000,
  admissionIntervalMs: 10_000,
  admissionReserveWindowMs: 1_000,
  saturation: { queueDepthThreshold: 5, kvThreshold: 0.9, maxConcurrency: 64, prefillBacklogTokens: 2048 },
  maxFlows: 256,
  queueCapacity: 1024,
  defaultOutputTokens: 256,
  newFlowQuantum: 16,
  maxColdWaitMs: 2000,
} as const;

/** The config used when the block is absent: flow control off (first come, first served). */
export function defaultFlowControl(enabled = false): FlowControlConfig {
  return {
    enabled,
    bands: [...DEFAULT_BANDS],
    defaultBand: 'standard',
    flows: [],
    admission: {
      mode: 'probabilistic',
      maxUtilisation: FLOW_DEFAULTS.maxUtilisation,
      shedding: 'fair',
      targetMs: FLOW_DEFAULTS.admissionTargetMs,
      intervalMs: FLOW_DEFAULTS.admissionIntervalMs,
      reserveWindowMs: FLOW_DEFAULTS.admissionReserveWindowMs,
    },
    fairness: { mode: 'tokens', bands: {}, defaultOutputTokens: FLOW_DEFAULTS.defaultOutputTokens, newFlowQuantum: FLOW_DEFAULTS.newFlowQuantum },
    turnPriority: { enabled: true, maxColdWaitMs: FLOW_DEFAULTS.maxColdWaitMs },
    limits: { maxRequests: Infinity, maxBytes: Infinity, bands: {} },
    ttlMs: FLOW_DEFAULTS.ttlMs,
    sweepIntervalMs: FLOW_DEFAULTS.sweepIntervalMs,
    retryAfterSeconds: FLOW_DEFAULTS.retryAfterSeconds,
    saturation: { ...FLOW_DEFAULTS.saturation },
    tenants: {},
    trustHeaders: true,
    maxFlows: FLOW_DEFAULTS.maxFlows,
    queueCapacity: FLOW_DEFAULTS.queueCapacity,
  };
}

export const FLOW_ID_RE = /^[A-Za-z0-9._:@/-]{1,128}$/;
const BAND_RE = /^[A-Za-z0-9._-]{1,64}$/;
const DURATION_RE = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/;

/** A value for an error message: short, and never a whole object. */
export function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? v.slice(0, 40) + '…' : v);
  if (typeof v === 'object') return 'an object';
  return String(v);
}

/** Parses a duration: a number of seconds, or a string like `250ms`, `60s`, `2m`. Returns ms, or NaN. */
export function parseDurationMs(v: unknown): number {
  if (typeof v === 'number') return Number.isFinite(v) && v >= 0 ? v * 1000 : NaN;
  if (typeof v !== 'string') return NaN;
  const m = DURATION_RE.exec(v);
  if (!m) return NaN;
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  return n * (unit === 'ms' ? 1 : unit === 's' ? 1000 : unit === 'm' ? 60_000 : 3_600_000);
}

// ---- field builders (flow control's message style: "must be ..., got <value>")

const bool = () => z.boolean({ error: (i) => `must be true or false, got ${describe(i.input)}` });

function num(lo: number, hi: number, opts: { integer?: boolean; loOpen?: boolean } = {}) {
  const msg = (i: { input?: unknown }) =>
    `must be ${opts.integer ? 'an integer' : 'a number'} in ${opts.loOpen ? '(' : '['}${lo}, ${hi === Infinity ? '∞' : hi}], got ${describe(i.input)}`;
  // one message per field: toConfigIssues drops the repeat when a value breaks two of these
  const e = { error: msg };
  const base = opts.integer ? z.int({ error: msg }) : z.number({ error: msg });
  return (opts.loOpen ? base.gt(lo, e) : base.gte(lo, e)).lte(hi, e);
}

/** A limit: a positive integer, or absent / null for no limit (Infinity). */
const limit = () => {
  const msg = (i: { input?: unknown }) => `must be a positive integer (or omitted for no limit), got ${describe(i.input)}`;
  return z
    .int({ error: msg })
    .gte(1, { error: msg })
    .nullable()
    .optional()
    .transform((v) => v ?? Infinity);
};

function duration(minMs: number) {
  const msg = (i: { input?: unknown }) =>
    `must be a duration of at least ${minMs} ms (seconds as a number, or a string like "250ms", "60s", "2m"), got ${describe(i.input)}`;
  return z
    .union([z.number({ error: msg }).gte(0, { error: msg }), z.string({ error: msg }).regex(DURATION_RE, { error: msg })], { error: msg })
    .transform((v, ctx) => {
      const ms = parseDurationMs(v);
      if (!(ms >= minMs)) ctx.addIssue({ code: 'custom', message: msg({ input: v }), input: v });
      return ms;
    });
}

const queueLimits = () =>
  z
    .strictObject(
      { maxRequests: limit(), maxBytes: limit() },
      {
        error: (i) =>
          i.code === 'unrecognized_keys'
            ? 'unknown field (allowed: maxRequests, maxBytes)'
            : `must be an object with maxRequests and/or maxBytes, got ${describe(i.input)}`,
      },
    )
    .prefault({});

function unknownField(allowed: string) {
  return `unknown field (allowed: ${allowed})`;
}

const flowIdMsg = (i: { input?: unknown }) =>
  `must be a flow id like "tenant:<name>" or "workload:<name>" (1-128 of A-Z a-z 0-9 . _ : @ / -), got ${describe(i.input)}`;

const flowSpec = z.strictObject(
  {
    id: z.string({ error: flowIdMsg }).regex(FLOW_ID_RE, { error: flowIdMsg }),
    // the band must be one of `bands`: checked with the other cross-field rules below
    priority: z.string({ error: (i) => `must be a band name, got ${describe(i.input)}` }).optional(),
    minShare: num(0, 1).optional(),
  },
  {
    error: (i) =>
      i.code === 'unrecognized_keys'
        ? unknownField('id, priority, minShare')
        : `must be an object with id, priority and optionally minShare, got ${describe(i.input)}`,
  },
);

const TOP_KEYS = [
  'enabled', 'bands', 'defaultBand', 'flows', 'admission', 'fairness', 'turnPriority', 'limits', 'ttl', 'sweepInterval',
  'retryAfterSeconds', 'saturation', 'tenants', 'trustHeaders', 'maxFlows', 'queueCapacity',
].join(', ');

const fairnessMode = () =>
  z.enum(['tokens', 'requests'], { error: (i) => `must be one of tokens, requests, got ${describe(i.input)}` });

/** `fairness: tokens` (every band) or `{ mode, bands: { <band>: requests }, defaultOutputTokens, newFlowQuantum }`. */
const fairnessInput = z
  .union(
    [
      fairnessMode().transform((mode) => ({
        mode,
        bands: {} as Record<string, FairnessMode>,
        defaultOutputTokens: FLOW_DEFAULTS.defaultOutputTokens,
        newFlowQuantum: FLOW_DEFAULTS.newFlowQuantum as number,
      })),
      z.strictObject(
        {
          mode: fairnessMode().default('tokens'),
          bands: z
            .record(z.string(), fairnessMode(), { error: (i) => `must map band names to tokens or requests, got ${describe(i.input)}` })
            .optional()
            .transform((v) => v ?? {}),
          defaultOutputTokens: num(1, 1e7, { integer: true }).default(FLOW_DEFAULTS.defaultOutputTokens),
          newFlowQuantum: num(0, 1e6)
            .default(FLOW_DEFAULTS.newFlowQuantum)
            .describe("requests' worth of work a flow returning from idle is served ahead of backlogged flows; 0 = off"),
        },
        {
          error: (i) =>
            i.code === 'unrecognized_keys'
              ? unknownField('mode, bands, defaultOutputTokens, newFlowQuantum')
              : `must be tokens, requests, or an object with mode, bands, defaultOutputTokens and newFlowQuantum, got ${describe(i.input)}`,
        },
      ),
    ],
    { error: (i) => `must be tokens, requests, or an object with mode, bands, defaultOutputTokens and newFlowQuantum, got ${describe(i.input)}` },
  )
  .prefault('tokens');

export const STALENESS_MOVED = 'removed: the one staleness setting is dataLayer.staleAfterMs (it applies to routing and saturation alike); set it there';

/** What a user writes under `flowControl:` (before the cross-field checks and defaults that depend on other fields). */
export const flowControlInput = z.strictObject(
  {
    enabled: bool().optional().describe('false: first come, first served'),
    bands: z
      .array(
        z.string({ error: (i) => `must be a band name (letters, digits, '.', '_', '-'), got ${describe(i.input)}` }).regex(BAND_RE, {
          error: (i) => `must be a band name (letters, digits, '.', '_', '-'), got ${describe(i.input)}`,
        }),
        { error: (i) => `must be a non-empty list of band names, highest priority first, got ${describe(i.input)}` },
      )
      .min(1, { error: (i) => `must be a non-empty list of band names, highest priority first, got ${describe(i.input)}` })
      .optional()
      .describe('band names, highest priority first (at most 32); default premium, standard, best-effort, batch'),
    defaultBand: z.string({ error: (i) => `must be a band name, got ${describe(i.input)}` }).optional(),
    flows: z.array(flowSpec, { error: (i) => `must be a list of {id, priority, minShare}, got ${describe(i.input)}` }).optional(),
    admission: z
      .strictObject(
        {
          mode: z
            .enum(['probabilistic', 'utilisation', 'off'], { error: (i) => `must be one of probabilistic, utilisation, off, got ${describe(i.input)}` })
            .default('probabilistic')
            .describe('probabilistic: hold what can drain within the ttl, shed only sustained overload; utilisation: shed by instantaneous utilisation (the rule before); off: never shed'),
          maxUtilisation: num(0, 1, { loOpen: true }).default(FLOW_DEFAULTS.maxUtilisation),
          shedding: z
            .enum(['fair', 'arrival'], { error: (i) => `must be one of fair, arrival, got ${describe(i.input)}` })
            .default('fair')
            .describe('fair: shed the flow furthest over its fair share; arrival: shed the arriving request (flow-blind)'),
          target: duration(1).prefault('1s').describe('queue sojourn above which a band may be overloaded (mode probabilistic): seconds, or "500ms", "1s"'),
          interval: duration(1).prefault('10s').describe('how long the sojourn must stay above target before the band sheds (mode probabilistic)'),
          reserveWindow: duration(0)
            .refine((ms) => ms === 0 || ms >= 1, { message: 'must be 0 (off) or a duration of at least 1 ms' })
            .prefault('1s')
            .describe('how long a band\'s peak in-flight count is remembered: lower bands leave free the slots higher bands used within it and released (0: off)'),
        },
        {
          error: (i) =>
            i.code === 'unrecognized_keys'
              ? unknownField('mode, maxUtilisation, shedding, target, interval, reserveWindow')
              : `must be an object with mode, maxUtilisation, shedding, target, interval and reserveWindow, got ${describe(i.input)}`,
        },
      )
      .prefault({}),
    fairness: fairnessInput.describe('tokens | requests, or { mode, bands: { <band>: tokens | requests }, defaultOutputTokens, newFlowQuantum }'),
    turnPriority: z
      .strictObject(
        {
          enabled: bool().default(true),
          maxColdWait: duration(0).prefault('2s').describe('seconds as a number, or "500ms", "2s"'),
        },
        {
          error: (i) =>
            i.code === 'unrecognized_keys' ? unknownField('enabled, maxColdWait') : `must be an object with enabled and maxColdWait, got ${describe(i.input)}`,
        },
      )
      .prefault({}),
    limits: z
      .strictObject(
        {
          maxRequests: limit(),
          maxBytes: limit(),
          bands: z
            .record(z.string(), queueLimits(), { error: (i) => `must map band names to {maxRequests, maxBytes}, got ${describe(i.input)}` })
            .optional(),
        },
        {
          error: (i) =>
            i.code === 'unrecognized_keys'
              ? unknownField('maxRequests, maxBytes, bands')
              : `must be an object with maxRequests, maxBytes and bands, got ${describe(i.input)}`,
        },
      )
      .prefault({}),
    ttl: duration(1).prefault('60s').describe('seconds as a number, or "250ms", "60s", "2m", "1h"'),
    sweepInterval: duration(1).prefault('250ms').describe('seconds as a number, or "250ms", "60s", "2m", "1h"'),
    retryAfterSeconds: num(0, 86_400, { integer: true }).default(FLOW_DEFAULTS.retryAfterSeconds),
    saturation: z
      .strictObject(
        {
          queueDepthThreshold: num(0, 1e9, { loOpen: true }).default(FLOW_DEFAULTS.saturation.queueDepthThreshold),
          kvThreshold: num(0, 1, { loOpen: true }).default(FLOW_DEFAULTS.saturation.kvThreshold),
          maxConcurrency: num(1, 1e9, { integer: true }).default(FLOW_DEFAULTS.saturation.maxConcurrency),
          prefillBacklogTokens: num(0, 1e9, { integer: true })
            .default(FLOW_DEFAULTS.saturation.prefillBacklogTokens)
            .describe('uncached prompt tokens dispatched and not yet prefilled at which an endpoint is saturated; 0 = off'),
          staleAfter: removedField(STALENESS_MOVED),
          staleAfterMs: removedField(STALENESS_MOVED),
        },
        {
          error: (i) =>
            i.code === 'unrecognized_keys' ? unknownField('queueDepthThreshold, kvThreshold, maxConcurrency, prefillBacklogTokens') : `must be an object, got ${describe(i.input)}`,
        },
      )
      .prefault({}),
    tenants: z
      .record(z.string(), z.unknown(), { error: (i) => `must map API keys to tenant ids, got ${describe(i.input)}` })
      .optional()
      .describe('API key (the token after "Authorization: Bearer") -> tenant id'),
    trustHeaders: bool().optional().describe('honour x-tenant-id; default true without tenants, false with tenants'),
    maxFlows: num(1, 65_000, { integer: true }).default(FLOW_DEFAULTS.maxFlows),
    queueCapacity: num(2, 1 << 20, { integer: true }).default(FLOW_DEFAULTS.queueCapacity),
  },
  {
    error: (i) => (i.code === 'unrecognized_keys' ? unknownField(TOP_KEYS) : `must be an object, got ${describe(i.input)}`),
  },
);

type FlowInput = z.output<typeof flowControlInput>;

/** Values produced by this schema: validateFlowControl passes them through as they are. */
const validated = new WeakSet<object>();

/** True for a FlowControlConfig this module produced (so validating it again is a no-op). */
export function isValidatedFlowControl(v: unknown): v is FlowControlConfig {
  return typeof v === 'object' && v !== null && validated.has(v);
}

/**
 * Cross-field checks (bands named by flows and limits, minShare sums, tenants
 * whose keys must not be echoed, maxFlows vs flows) and the final config.
 * Runs even when a field failed, so every problem is reported at once.
 */
function finish(v: FlowInput, ctx: z.core.$RefinementCtx<FlowInput>): FlowControlConfig {
  const cfg = defaultFlowControl(v.enabled ?? true);
  const add = (path: PropertyKey[], message: string) => ctx.addIssue({ code: 'custom', path, message, input: undefined });

  if (Array.isArray(v.bands)) {
    const seen = new Set<string>();
    const bands: string[] = [];
    v.bands.forEach((b, i) => {
      if (typeof b !== 'string' || !BAND_RE.test(b)) return; // reported by the field
      if (seen.has(b)) add(['bands', i], `duplicate band ${JSON.stringify(b)}`);
      else {
        seen.add(b);
        bands.push(b);
      }
    });
    if (bands.length > 32) add(['bands'], `at most 32 bands, got ${bands.length}`);
    if (bands.length > 0) cfg.bands = bands;
  }
  const bandList = cfg.bands.join(', ');
  const knownBand = (b: unknown, path: PropertyKey[]): string | undefined => {
    if (typeof b !== 'string' || !cfg.bands.includes(b)) {
      add(path, `must be one of the bands (${bandList}), got ${describe(b)}`);
      return undefined;
    }
    return b;
  };
  if (v.defaultBand !== undefined) cfg.defaultBand = (typeof v.defaultBand === 'string' ? knownBand(v.defaultBand, ['defaultBand']) : undefined) ?? cfg.defaultBand;
  else if (!cfg.bands.includes(cfg.defaultBand)) cfg.defaultBand = cfg.bands[Math.floor((cfg.bands.length - 1) / 2)]!;

  if (Array.isArray(v.flows)) {
    const ids = new Set<string>();
    v.flows.forEach((f, i) => {
      if (!isMapping(f)) return;
      let id: string | undefined;
      if (typeof f.id === 'string' && FLOW_ID_RE.test(f.id)) {
        if (ids.has(f.id)) add(['flows', i, 'id'], `duplicate flow id ${JSON.stringify(f.id)}`);
        else ids.add((id = f.id));
      }
      const priority =
        f.priority === undefined ? cfg.defaultBand : typeof f.priority === 'string' ? knownBand(f.priority, ['flows', i, 'priority']) : undefined;
      const minShare = typeof f.minShare === 'number' && f.minShare >= 0 && f.minShare <= 1 ? f.minShare : f.minShare === undefined ? 0 : undefined;
      if (id !== undefined && priority !== undefined && minShare !== undefined) cfg.flows.push({ id, priority, minShare });
    });
    // minShares inside one band cannot promise more than everything
    const perBand = new Map<string, number>();
    for (const f of cfg.flows) perBand.set(f.priority, (perBand.get(f.priority) ?? 0) + f.minShare);
    for (const [band, sum] of perBand) {
      if (sum > 1 + 1e-9) add(['flows'], `the minShare values of band ${JSON.stringify(band)} add up to ${+sum.toFixed(6)}, more than 1`);
    }
  }

  if (isMapping(v.admission)) {
    const a = v.admission;
    cfg.admission = { mode: a.mode, maxUtilisation: a.maxUtilisation, shedding: a.shedding, targetMs: a.target, intervalMs: a.interval, reserveWindowMs: a.reserveWindow };
    if (typeof a.target === 'number' && typeof a.interval === 'number' && a.interval < a.target) {
      add(['admission', 'interval'], `must be at least admission.target (${a.target} ms), got ${a.interval} ms`);
    }
  }
  if (isMapping(v.fairness)) {
    const f = v.fairness;
    cfg.fairness = { mode: f.mode, bands: {}, defaultOutputTokens: f.defaultOutputTokens, newFlowQuantum: f.newFlowQuantum };
    if (isMapping(f.bands)) {
      for (const [band, mode] of Object.entries(f.bands)) {
        if (!cfg.bands.includes(band)) add(['fairness', 'bands', band], `unknown band (bands: ${bandList})`);
        else cfg.fairness.bands[band] = mode;
      }
    }
  }
  if (isMapping(v.turnPriority)) cfg.turnPriority = { enabled: v.turnPriority.enabled, maxColdWaitMs: v.turnPriority.maxColdWait };
  if (isMapping(v.limits)) {
    cfg.limits.maxRequests = v.limits.maxRequests;
    cfg.limits.maxBytes = v.limits.maxBytes;
    if (isMapping(v.limits.bands)) {
      for (const [band, l] of Object.entries(v.limits.bands)) {
        if (!cfg.bands.includes(band)) add(['limits', 'bands', band], `unknown band (bands: ${bandList})`);
        else if (isMapping(l)) cfg.limits.bands[band] = { maxRequests: l.maxRequests, maxBytes: l.maxBytes };
      }
    }
  }
  cfg.ttlMs = v.ttl;
  cfg.sweepIntervalMs = v.sweepInterval;
  cfg.retryAfterSeconds = v.retryAfterSeconds;
  if (isMapping(v.saturation)) {
    const s = v.saturation;
    cfg.saturation = { queueDepthThreshold: s.queueDepthThreshold, kvThreshold: s.kvThreshold, maxConcurrency: s.maxConcurrency, prefillBacklogTokens: s.prefillBacklogTokens };
  }

  if (isMapping(v.tenants)) {
    for (const [key, tenant] of Object.entries(v.tenants)) {
      // never echo the key itself: it is a secret
      const at = ['tenants', rawSegment(`key ${key.length > 4 ? key.slice(0, 4) + '…' : '…'}`)];
      if (key.length === 0 || /\s/.test(key)) add(at, 'API keys must be non-empty and contain no whitespace');
      else if (typeof tenant !== 'string' || !FLOW_ID_RE.test(tenant)) add(at, `must be a tenant id (1-128 of A-Z a-z 0-9 . _ : @ / -), got ${describe(tenant)}`);
      else cfg.tenants[key] = tenant;
    }
  }
  // With API keys configured, identity comes from the key: a header naming a
  // tenant is only believed when the operator says a fronting gateway
  // authenticated it (trustHeaders: true).
  cfg.trustHeaders = typeof v.trustHeaders === 'boolean' ? v.trustHeaders : !(isMapping(v.tenants) && Object.keys(v.tenants).length > 0);
  cfg.maxFlows = v.maxFlows;
  cfg.queueCapacity = v.queueCapacity;
  if (typeof v.maxFlows === 'number' && cfg.flows.length > v.maxFlows) add(['maxFlows'], `must be at least the number of declared flows (${cfg.flows.length})`);
  // turn priority keeps a second native queue per (flow, band): both must fit the native limit of 65536 queues
  if (cfg.turnPriority.enabled && typeof v.maxFlows === 'number' && 2 * (v.maxFlows + cfg.bands.length) > 65_536) {
    add(['maxFlows'], `must be at most ${32_768 - cfg.bands.length} with turnPriority enabled (two queues per flow and band), got ${v.maxFlows}`);
  }
  return cfg;
}

/**
 * The `flowControl` block: what a user writes → the validated, defaulted
 * FlowControlConfig. The cross-field rules run even when a field failed (zod
 * would skip a plain transform then), so every problem is listed at once.
 */
export const flowControlSchema = flowControlInput
  .superRefine((v, ctx) => {
    if (isMapping(v)) finish(v, ctx);
  }, ALWAYS)
  .transform((v) => {
    const cfg = finish(v, NO_ISSUES);
    validated.add(cfg);
    return cfg;
  });

/** finish() after the refinement above passed: it finds nothing to report. */
const NO_ISSUES = { addIssue: () => {} } as unknown as z.core.$RefinementCtx<FlowInput>;

/**
 * Validates a raw `flowControl` block: the config, or every problem as
 * ConfigIssues (paths under `path`). `undefined`/`null` → flow control off; a
 * config this module produced passes through unchanged.
 */
export function parseFlowControl(raw: unknown, path = 'flowControl'): { value?: FlowControlConfig; issues: { path: string; message: string }[] } {
  if (raw === undefined || raw === null) return { value: defaultFlowControl(false), issues: [] };
  if (isValidatedFlowControl(raw)) return { value: raw, issues: [] };
  const r = flowControlSchema.safeParse(raw);
  return r.success ? { value: r.data, issues: [] } : { issues: toConfigIssues(r.error.issues, path) };
}
