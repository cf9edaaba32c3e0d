// The `flowControl` block of the router config: types, defaults, validation.
// validateFlowControl collects every problem with its field path, e.g.
// `flowControl.flows[1].minShare: must be a number in [0, 1]`, so the router's
// config loader can report them all at once. docs/flow-control.md documents
// each field.

export const DEFAULT_BANDS = ['premium', 'standard', 'best-effort', 'batch'] as const;

export type AdmissionMode = 'probabilistic' | 'off';

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
  /** Metrics older than this are stale: only the in-flight cap applies. */
  staleAfterMs: number;
}

export interface FlowControlConfig {
  enabled: boolean;
  /** Band names, highest priority first. */
  bands: string[];
  /** Band of flows not declared in `flows`. */
  defaultBand: string;
  flows: FlowSpec[];
  admission: { mode: AdmissionMode; maxUtilisation: number };
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
  /** Honour `x-tenant-id` (and `tenant:` ids in other headers). */
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
  saturation: { queueDepthThreshold: 5, kvThreshold: 0.9, maxConcurrency: 64, staleAfterMs: 2_000 },
  maxFlows: 256,
  queueCapacity: 1024,
} as const;

/** The config used when the block is absent: flow control off (first come, first served). */
export function defaultFlowControl(enabled = false): FlowControlConfig {
  return {
    enabled,
    bands: [...DEFAULT_BANDS],
    defaultBand: 'standard',
    flows: [],
    admission: { mode: 'probabilistic', maxUtilisation: FLOW_DEFAULTS.maxUtilisation },
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

const ID_RE = /^[A-Za-z0-9._:@/-]{1,128}$/;
const BAND_RE = /^[A-Za-z0-9._-]{1,64}$/;

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function describe(v: unknown): string {
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
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(v);
  if (!m) return NaN;
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  return n * (unit === 'ms' ? 1 : unit === 's' ? 1000 : unit === 'm' ? 60_000 : 3_600_000);
}

class Checker {
  readonly errors: string[] = [];
  err(path: string, msg: string): void {
    this.errors.push(`${path}: ${msg}`);
  }
  keys(obj: Record<string, unknown>, allowed: readonly string[], path: string): void {
    for (const k of Object.keys(obj)) {
      if (!allowed.includes(k)) this.err(`${path}.${k}`, `unknown field (allowed: ${allowed.join(', ')})`);
    }
  }
  bool(v: unknown, path: string, dflt: boolean): boolean {
    if (v === undefined) return dflt;
    if (typeof v !== 'boolean') {
      this.err(path, `must be true or false, got ${describe(v)}`);
      return dflt;
    }
    return v;
  }
  num(v: unknown, path: string, dflt: number, lo: number, hi: number, opts: { integer?: boolean; loOpen?: boolean } = {}): number {
    if (v === undefined) return dflt;
    const ok =
      typeof v === 'number' &&
      Number.isFinite(v) &&
      (opts.loOpen ? v > lo : v >= lo) &&
      v <= hi &&
      (!opts.integer || Number.isInteger(v));
    if (!ok) {
      const range = `${opts.loOpen ? '(' : '['}${lo}, ${hi === Infinity ? '∞' : hi}]`;
      this.err(path, `must be ${opts.integer ? 'an integer' : 'a number'} in ${range}, got ${describe(v)}`);
      return dflt;
    }
    return v as number;
  }
  /** A limit: a positive integer, or absent / null for no limit. */
  limit(v: unknown, path: string): number {
    if (v === undefined || v === null) return Infinity;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) {
      this.err(path, `must be a positive integer (or omitted for no limit), got ${describe(v)}`);
      return Infinity;
    }
    return v;
  }
  duration(v: unknown, path: string, dfltMs: number, minMs: number): number {
    if (v === undefined) return dfltMs;
    const ms = parseDurationMs(v);
    if (!(ms >= minMs)) {
      this.err(path, `must be a duration of at least ${minMs} ms (seconds as a number, or a string like "250ms", "60s", "2m"), got ${describe(v)}`);
      return dfltMs;
    }
    return ms;
  }
  limits(v: unknown, path: string): QueueLimits {
    if (v === undefined) return { maxRequests: Infinity, maxBytes: Infinity };
    if (!isObject(v)) {
      this.err(path, `must be an object with maxRequests and/or maxBytes, got ${describe(v)}`);
      return { maxRequests: Infinity, maxBytes: Infinity };
    }
    this.keys(v, ['maxRequests', 'maxBytes'], path);
    return { maxRequests: this.limit(v.maxRequests, `${path}.maxRequests`), maxBytes: this.limit(v.maxBytes, `${path}.maxBytes`) };
  }
}

const TOP_KEYS = [
  'enabled',
  'bands',
  'defaultBand',
  'flows',
  'admission',
  'limits',
  'ttl',
  'sweepInterval',
  'retryAfterSeconds',
  'saturation',
  'tenants',
  'trustHeaders',
  'maxFlows',
  'queueCapacity',
] as const;

/**
 * Validates the raw `flowControl` block (as parsed from YAML). `undefined` or
 * `null` gives the defaults with flow control off. Returns the normalised
 * config when there are no errors; otherwise every problem as `path: reason`.
 */
export function validateFlowControl(raw: unknown, path = 'flowControl'): { value?: FlowControlConfig; errors: string[] } {
  if (raw === undefined || raw === null) return { value: defaultFlowControl(false), errors: [] };
  const c = new Checker();
  if (!isObject(raw)) {
    c.err(path, `must be an object, got ${describe(raw)}`);
    return { errors: c.errors };
  }
  c.keys(raw, TOP_KEYS, path);
  const cfg = defaultFlowControl(true);
  cfg.enabled = c.bool(raw.enabled, `${path}.enabled`, true);

  // bands
  if (raw.bands !== undefined) {
    if (!Array.isArray(raw.bands) || raw.bands.length === 0) {
      c.err(`${path}.bands`, `must be a non-empty list of band names, highest priority first, got ${describe(raw.bands)}`);
    } else {
      const seen = new Set<string>();
      const bands: string[] = [];
      raw.bands.forEach((b, i) => {
        if (typeof b !== 'string' || !BAND_RE.test(b)) c.err(`${path}.bands[${i}]`, `must be a band name (letters, digits, '.', '_', '-'), got ${describe(b)}`);
        else if (seen.has(b)) c.err(`${path}.bands[${i}]`, `duplicate band ${JSON.stringify(b)}`);
        else {
          seen.add(b);
          bands.push(b);
        }
      });
      if (bands.length > 32) c.err(`${path}.bands`, `at most 32 bands, got ${bands.length}`);
      if (bands.length > 0) cfg.bands = bands;
    }
  }
  const bandList = cfg.bands.join(', ');
  const knownBand = (b: unknown, p: string): string | undefined => {
    if (typeof b !== 'string' || !cfg.bands.includes(b)) {
      c.err(p, `must be one of the bands (${bandList}), got ${describe(b)}`);
      return undefined;
    }
    return b;
  };

  if (raw.defaultBand !== undefined) cfg.defaultBand = knownBand(raw.defaultBand, `${path}.defaultBand`) ?? cfg.defaultBand;
  else if (!cfg.bands.includes(cfg.defaultBand)) cfg.defaultBand = cfg.bands[Math.floor((cfg.bands.length - 1) / 2)]!;

  // flows
  if (raw.flows !== undefined) {
    if (!Array.isArray(raw.flows)) c.err(`${path}.flows`, `must be a list of {id, priority, minShare}, got ${describe(raw.flows)}`);
    else {
      const ids = new Set<string>();
      raw.flows.forEach((f, i) => {
        const p = `${path}.flows[${i}]`;
        if (!isObject(f)) {
          c.err(p, `must be an object with id, priority and optionally minShare, got ${describe(f)}`);
          return;
        }
        c.keys(f, ['id', 'priority', 'minShare'], p);
        let id: string | undefined;
        if (typeof f.id !== 'string' || !ID_RE.test(f.id)) {
          c.err(`${p}.id`, `must be a flow id like "tenant:<name>" or "workload:<name>" (1-128 of A-Z a-z 0-9 . _ : @ / -), got ${describe(f.id)}`);
        } else if (ids.has(f.id)) c.err(`${p}.id`, `duplicate flow id ${JSON.stringify(f.id)}`);
        else {
          id = f.id;
          ids.add(id);
        }
        const priority = f.priority === undefined ? cfg.defaultBand : knownBand(f.priority, `${p}.priority`);
        let minShare = 0;
        if (f.minShare !== undefined) {
          if (typeof f.minShare !== 'number' || !Number.isFinite(f.minShare) || f.minShare < 0 || f.minShare > 1) {
            c.err(`${p}.minShare`, `must be a number in [0, 1], got ${describe(f.minShare)}`);
          } else minShare = f.minShare;
        }
        if (id !== undefined && priority !== undefined) cfg.flows.push({ id, priority, minShare });
      });
      // minShares inside one band cannot promise more than everything
      const perBand = new Map<string, number>();
      for (const f of cfg.flows) perBand.set(f.priority, (perBand.get(f.priority) ?? 0) + f.minShare);
      for (const [band, sum] of perBand) {
        if (sum > 1 + 1e-9) c.err(`${path}.flows`, `the minShare values of band ${JSON.stringify(band)} add up to ${+sum.toFixed(6)}, more than 1`);
      }
    }
  }

  // admission
  if (raw.admission !== undefined) {
    const a = raw.admission;
    const p = `${path}.admission`;
    if (!isObject(a)) c.err(p, `must be an object with mode and maxUtilisation, got ${describe(a)}`);
    else {
      c.keys(a, ['mode', 'maxUtilisation'], p);
      if (a.mode !== undefined) {
        if (a.mode === 'probabilistic' || a.mode === 'off') cfg.admission.mode = a.mode;
        else c.err(`${p}.mode`, `must be one of probabilistic, off, got ${describe(a.mode)}`);
      }
      cfg.admission.maxUtilisation = c.num(a.maxUtilisation, `${p}.maxUtilisation`, cfg.admission.maxUtilisation, 0, 1, { loOpen: true });
    }
  }

  // limits
  if (raw.limits !== undefined) {
    const l = raw.limits;
    const p = `${path}.limits`;
    if (!isObject(l)) c.err(p, `must be an object with maxRequests, maxBytes and bands, got ${describe(l)}`);
    else {
      c.keys(l, ['maxRequests', 'maxBytes', 'bands'], p);
      cfg.limits.maxRequests = c.limit(l.maxRequests, `${p}.maxRequests`);
      cfg.limits.maxBytes = c.limit(l.maxBytes, `${p}.maxBytes`);
      if (l.bands !== undefined) {
        if (!isObject(l.bands)) c.err(`${p}.bands`, `must map band names to {maxRequests, maxBytes}, got ${describe(l.bands)}`);
        else {
          for (const [band, v] of Object.entries(l.bands)) {
            if (!cfg.bands.includes(band)) {
              c.err(`${p}.bands.${band}`, `unknown band (bands: ${bandList})`);
              continue;
            }
            cfg.limits.bands[band] = c.limits(v, `${p}.bands.${band}`);
          }
        }
      }
    }
  }

  cfg.ttlMs = c.duration(raw.ttl, `${path}.ttl`, cfg.ttlMs, 1);
  cfg.sweepIntervalMs = c.duration(raw.sweepInterval, `${path}.sweepInterval`, cfg.sweepIntervalMs, 1);
  cfg.retryAfterSeconds = c.num(raw.retryAfterSeconds, `${path}.retryAfterSeconds`, cfg.retryAfterSeconds, 0, 86_400, { integer: true });

  // saturation
  if (raw.saturation !== undefined) {
    const s = raw.saturation;
    const p = `${path}.saturation`;
    if (!isObject(s)) c.err(p, `must be an object, got ${describe(s)}`);
    else {
      c.keys(s, ['queueDepthThreshold', 'kvThreshold', 'maxConcurrency', 'staleAfter'], p);
      const d = cfg.saturation;
      d.queueDepthThreshold = c.num(s.queueDepthThreshold, `${p}.queueDepthThreshold`, d.queueDepthThreshold, 0, 1e9, { loOpen: true });
      d.kvThreshold = c.num(s.kvThreshold, `${p}.kvThreshold`, d.kvThreshold, 0, 1, { loOpen: true });
      d.maxConcurrency = c.num(s.maxConcurrency, `${p}.maxConcurrency`, d.maxConcurrency, 1, 1e9, { integer: true });
      d.staleAfterMs = c.duration(s.staleAfter, `${p}.staleAfter`, d.staleAfterMs, 1);
    }
  }

  // tenants
  if (raw.tenants !== undefined) {
    const t = raw.tenants;
    const p = `${path}.tenants`;
    if (!isObject(t)) c.err(p, `must map API keys to tenant ids, got ${describe(t)}`);
    else {
      for (const [key, tenant] of Object.entries(t)) {
        // never echo the key itself: it is a secret
        const kp = `${p}[key ${key.length > 4 ? key.slice(0, 4) + '…' : '…'}]`;
        if (key.length === 0 || /\s/.test(key)) c.err(kp, 'API keys must be non-empty and contain no whitespace');
        else if (typeof tenant !== 'string' || !ID_RE.test(tenant)) c.err(kp, `must be a tenant id (1-128 of A-Z a-z 0-9 . _ : @ / -), got ${describe(tenant)}`);
        else cfg.tenants[key] = tenant;
      }
    }
  }

  cfg.trustHeaders = c.bool(raw.trustHeaders, `${path}.trustHeaders`, true);
  cfg.maxFlows = c.num(raw.maxFlows, `${path}.maxFlows`, cfg.maxFlows, 1, 65_000, { integer: true });
  cfg.queueCapacity = c.num(raw.queueCapacity, `${path}.queueCapacity`, cfg.queueCapacity, 2, 1 << 20, { integer: true });
  if (cfg.flows.length > cfg.maxFlows) {
    c.err(`${path}.maxFlows`, `must be at least the number of declared flows (${cfg.flows.length})`);
  }

  return c.errors.length > 0 ? { errors: c.errors } : { value: cfg, errors: [] };
}
