// The switchyard/v1 Router config: types, defaults and validation. Validation
// collects every problem (with its field path) before failing, so a user fixes
// a file in one pass. docs/config.md documents each field.
import { isIP } from 'node:net';
import { ConfigError, type ConfigIssue } from '../errors.js';

export const API_VERSION = 'switchyard/v1';
export const ENGINES = ['vllm', 'sglang'] as const;
export const ACCELERATORS = ['nvidia', 'amd', 'intel', 'tpu'] as const;
export const ROLES = ['both', 'prefill', 'decode', 'encode'] as const;
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export type Engine = (typeof ENGINES)[number];
export type Accelerator = (typeof ACCELERATORS)[number];
export type Role = (typeof ROLES)[number];

export interface CapacityConfig {
  /** Prefix-index blocks (of `scheduling.prefixBlockSize` bytes) per tier. */
  gpuBlocks: number;
  cpuBlocks: number;
  diskBlocks: number;
}

export interface EndpointConfig {
  name: string;
  url: string;
  role: Role;
  revision?: string;
  capacity?: CapacityConfig;
}

export interface PoolConfig {
  name: string;
  engine: Engine;
  accelerator: Accelerator;
  models: string[];
  endpoints: EndpointConfig[];
}

export interface PluginSpec {
  type: string;
  /** Plugin-specific parameters; the registry's factory fills defaults. */
  params: Record<string, unknown>;
}

export interface ScorerSpec extends PluginSpec {
  weight: number;
}

export interface SchedulingConfig {
  filters: PluginSpec[];
  scorers: ScorerSpec[];
  picker: PluginSpec;
  /** Bytes per block of the native prefix index. */
  prefixBlockSize: number;
}

export interface DataLayerConfig {
  scrapeIntervalMs: number;
  staleAfterMs: number;
  healthIntervalMs: number;
  healthTimeoutMs: number;
  breakerFailures: number;
  breakerCooldownMs: number;
}

export const UPSTREAM_CLIENTS = ['auto', 'h1', 'native', 'undici'] as const;

export interface ProxyConfig {
  /** Upstream HTTP client: the lean built-in HTTP/1.1 client, the native (addon) HTTP/1.1 client, or undici. */
  client: (typeof UPSTREAM_CLIENTS)[number];
  maxRetries: number;
  connectionsPerEndpoint: number;
  connectTimeoutMs: number;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
}

export interface LimitsConfig {
  maxBodyBytes: number;
  requestBodyTimeoutMs: number;
}

export interface RouterConfig {
  apiVersion: typeof API_VERSION;
  kind: 'Router';
  listen: { host: string; port: number };
  pools: PoolConfig[];
  scheduling: SchedulingConfig;
  dataLayer: DataLayerConfig;
  proxy: ProxyConfig;
  limits: LimitsConfig;
  logging: { level: (typeof LOG_LEVELS)[number] };
  /** Owned by flow control (a later layer); passed through unvalidated. */
  flowControl?: unknown;
}

export const DEFAULT_SCORERS: ScorerSpec[] = [
  { type: 'prefix-cache', weight: 3, params: {} },
  { type: 'queue', weight: 2, params: {} },
  { type: 'kv-cache-utilization', weight: 2, params: {} },
];
export const DEFAULT_FILTERS: PluginSpec[] = [
  { type: 'model', params: {} },
  { type: 'healthy', params: {} },
  { type: 'role', params: {} },
];

export const DEFAULTS = {
  listen: { host: '127.0.0.1', port: 8000 },
  scheduling: { picker: 'max-score', prefixBlockSize: 64 },
  dataLayer: {
    scrapeIntervalMs: 50,
    staleAfterMs: 2000,
    healthIntervalMs: 1000,
    healthTimeoutMs: 1000,
    breakerFailures: 3,
    breakerCooldownMs: 5000,
  } satisfies DataLayerConfig,
  proxy: {
    client: 'auto' as (typeof UPSTREAM_CLIENTS)[number],
    maxRetries: 2,
    connectionsPerEndpoint: 256,
    connectTimeoutMs: 2000,
    headersTimeoutMs: 300_000,
    bodyTimeoutMs: 300_000,
  } satisfies ProxyConfig,
  limits: { maxBodyBytes: 16 * 1024 * 1024, requestBodyTimeoutMs: 30_000 } satisfies LimitsConfig,
  logging: { level: 'info' as const },
};

const TOP_KEYS = new Set([
  'apiVersion', 'kind', 'listen', 'pools', 'scheduling', 'dataLayer', 'proxy', 'limits', 'logging', 'flowControl',
]);

type Obj = Record<string, unknown>;

class Checker {
  readonly issues: ConfigIssue[] = [];
  add(path: string, message: string): void {
    this.issues.push({ path, message });
  }
  isObj(v: unknown): v is Obj {
    return typeof v === 'object' && v !== null && !Array.isArray(v);
  }
  /** Returns the object at `path` (or {} when absent); reports non-objects and unknown keys. */
  obj(v: unknown, path: string, keys: readonly string[], optional = true): Obj {
    if (v === undefined || v === null) {
      if (!optional) this.add(path, 'is required');
      return {};
    }
    if (!this.isObj(v)) {
      this.add(path, 'must be a mapping');
      return {};
    }
    for (const k of Object.keys(v)) if (!keys.includes(k)) this.add(join(path, k), `unknown field (expected one of: ${keys.join(', ')})`);
    return v;
  }
  str(o: Obj, key: string, path: string, def?: string): string {
    const v = o[key];
    if (v === undefined || v === null) {
      if (def === undefined) this.add(join(path, key), 'is required');
      return def ?? '';
    }
    if (typeof v !== 'string' || v.length === 0) {
      this.add(join(path, key), 'must be a non-empty string');
      return def ?? '';
    }
    return v;
  }
  oneOf<T extends string>(o: Obj, key: string, path: string, allowed: readonly T[], def?: T): T {
    const v = o[key];
    if (v === undefined || v === null) {
      if (def === undefined) this.add(join(path, key), `is required (one of: ${allowed.join(', ')})`);
      return (def ?? allowed[0]) as T;
    }
    if (typeof v !== 'string' || !allowed.includes(v as T)) {
      this.add(join(path, key), `must be one of: ${allowed.join(', ')} (got ${JSON.stringify(v)})`);
      return (def ?? allowed[0]) as T;
    }
    return v as T;
  }
  int(o: Obj, key: string, path: string, def: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
    const v = o[key];
    if (v === undefined || v === null) return def;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
      this.add(join(path, key), `must be an integer in [${min}, ${max}] (got ${JSON.stringify(v)})`);
      return def;
    }
    return v;
  }
  num(o: Obj, key: string, path: string, def: number, min: number, max: number): number {
    const v = o[key];
    if (v === undefined || v === null) return def;
    if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) {
      this.add(join(path, key), `must be a number in [${min}, ${max}] (got ${JSON.stringify(v)})`);
      return def;
    }
    return v;
  }
  arr(v: unknown, path: string, required: boolean): unknown[] {
    if (v === undefined || v === null) {
      if (required) this.add(path, 'is required');
      return [];
    }
    if (!Array.isArray(v)) {
      this.add(path, 'must be a list');
      return [];
    }
    return v;
  }
}

function join(path: string, key: string): string {
  return path ? `${path}.${key}` : key;
}

/** True when an http URL's host is an IP address literal (what `proxy.client: auto` hands to the native client). */
export function hostIsIp(url: string): boolean {
  try {
    return isIP(new URL(url).hostname.replace(/^\[|\]$/g, '')) !== 0;
  } catch {
    return false;
  }
}

/** True when an http URL's host is an IP address literal or localhost (what the native client can connect to). */
export function hostIsAddress(url: string): boolean {
  try {
    const host = new URL(url).hostname.replace(/^\[|\]$/g, '');
    return host === 'localhost' || isIP(host) !== 0;
  } catch {
    return false;
  }
}

/**
 * The origin (`scheme://host[:port]`, scheme lower-cased) of an http(s) URL
 * without path, query, fragment or credentials, or null. The clients and the
 * data layer take the stored URL as is: `HTTP://h` failed in the h1 client,
 * and a `#fragment` made the data layer's undici client throw at startup.
 */
function httpOrigin(s: string): string | null {
  try {
    const u = new URL(s);
    const ok =
      (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== '' && (u.pathname === '/' || u.pathname === '') &&
      !u.search && !u.hash && !s.includes('#') && !u.username && !u.password;
    return ok ? `${u.protocol}//${u.host}` : null;
  } catch {
    return null;
  }
}

/** Control characters (C0 and DEL): not allowed in an endpoint name, which goes into a response header. */
const CONTROL_CHARS = /[\x00-\x1f\x7f]/;

function pluginSpec(c: Checker, v: unknown, path: string, withWeight: boolean): ScorerSpec | null {
  if (typeof v === 'string' && v.length > 0) return { type: v, params: {}, weight: 1 };
  const keys = withWeight ? ['type', 'weight', 'params'] : ['type', 'params'];
  if (!c.isObj(v)) {
    c.add(path, withWeight ? 'must be a mapping {type, weight, params}' : 'must be a plugin type name or a mapping {type, params}');
    return null;
  }
  const o = c.obj(v, path, keys);
  const type = c.str(o, 'type', path);
  const weight = withWeight ? c.num(o, 'weight', path, 1, 0, 1e6) : 1;
  let params: Obj = {};
  if (o.params !== undefined && o.params !== null) {
    if (!c.isObj(o.params)) c.add(join(path, 'params'), 'must be a mapping');
    else params = o.params;
  }
  return type ? { type, weight, params } : null;
}

/**
 * Validates a parsed config document and fills defaults. Throws ConfigError
 * listing every problem. `validatePlugin` (optional) checks plugin types and
 * parameters against the registry and returns problems as messages.
 */
export function validateConfig(
  doc: unknown,
  validatePlugin?: (kind: 'filter' | 'scorer' | 'picker', spec: PluginSpec) => string[],
  source?: string,
): RouterConfig {
  const c = new Checker();
  if (!c.isObj(doc)) throw new ConfigError([{ path: '', message: 'the config must be a YAML mapping' }], source);
  for (const k of Object.keys(doc)) {
    if (!TOP_KEYS.has(k)) c.add(k, `unknown top-level field (expected one of: ${[...TOP_KEYS].join(', ')})`);
  }
  if (doc.apiVersion !== API_VERSION) c.add('apiVersion', `must be "${API_VERSION}" (got ${JSON.stringify(doc.apiVersion)})`);
  if (doc.kind !== 'Router') c.add('kind', `must be "Router" (got ${JSON.stringify(doc.kind)})`);

  const lo = c.obj(doc.listen, 'listen', ['host', 'port']);
  const listen = { host: c.str(lo, 'host', 'listen', DEFAULTS.listen.host), port: c.int(lo, 'port', 'listen', DEFAULTS.listen.port, 0, 65535) };

  const pools: PoolConfig[] = [];
  const poolNames = new Set<string>();
  const epNames = new Set<string>();
  const rawPools = c.arr(doc.pools, 'pools', true);
  if (Array.isArray(doc.pools) && rawPools.length === 0) c.add('pools', 'must list at least one pool');
  rawPools.forEach((rp, i) => {
    const pp = `pools[${i}]`;
    const po = c.obj(rp, pp, ['name', 'engine', 'accelerator', 'models', 'endpoints'], false);
    const name = c.str(po, 'name', pp);
    if (name && poolNames.has(name)) c.add(`${pp}.name`, `duplicate pool name "${name}"`);
    poolNames.add(name);
    const engine = c.oneOf(po, 'engine', pp, ENGINES, 'vllm');
    const accelerator = c.oneOf(po, 'accelerator', pp, ACCELERATORS, 'nvidia');
    const models: string[] = [];
    const rawModels = c.arr(po.models, `${pp}.models`, true);
    if (Array.isArray(po.models) && rawModels.length === 0) c.add(`${pp}.models`, 'must list at least one model');
    rawModels.forEach((m, j) => {
      if (typeof m !== 'string' || m.length === 0) c.add(`${pp}.models[${j}]`, 'must be a non-empty string');
      // listed twice, each endpoint of the pool would be a candidate twice for the model
      else if (models.includes(m)) c.add(`${pp}.models[${j}]`, `duplicate model "${m}" in this pool`);
      else models.push(m);
    });
    const endpoints: EndpointConfig[] = [];
    const rawEps = c.arr(po.endpoints, `${pp}.endpoints`, true);
    if (Array.isArray(po.endpoints) && rawEps.length === 0) c.add(`${pp}.endpoints`, 'must list at least one endpoint');
    rawEps.forEach((re, j) => {
      const ep = `${pp}.endpoints[${j}]`;
      const eo = c.obj(re, ep, ['name', 'url', 'role', 'revision', 'capacity'], false);
      const rawUrl = c.str(eo, 'url', ep);
      const origin = rawUrl ? httpOrigin(rawUrl) : null;
      if (rawUrl && origin === null) {
        c.add(`${ep}.url`, `must be an http(s) URL with no path, query, fragment or credentials, e.g. http://10.0.0.5:8000 (got ${JSON.stringify(rawUrl)})`);
      }
      const url = origin ?? rawUrl.replace(/\/$/, '');
      const epName = c.str(eo, 'name', ep, url ? safeName(url) : undefined);
      if (CONTROL_CHARS.test(epName)) {
        c.add(`${ep}.name`, `must not contain control characters (it is sent in the x-switchyard-endpoint header; got ${JSON.stringify(epName)})`);
      } else if (epName && epNames.has(epName)) c.add(`${ep}.name`, `duplicate endpoint name "${epName}" (names are unique across pools)`);
      epNames.add(epName);
      const role = c.oneOf(eo, 'role', ep, ROLES, 'both');
      const revision = eo.revision === undefined ? undefined : c.str(eo, 'revision', ep);
      let capacity: CapacityConfig | undefined;
      if (eo.capacity !== undefined) {
        const cp = `${ep}.capacity`;
        const co = c.obj(eo.capacity, cp, ['gpuBlocks', 'cpuBlocks', 'diskBlocks']);
        capacity = {
          gpuBlocks: c.int(co, 'gpuBlocks', cp, 0, 0, 2 ** 31 - 1),
          cpuBlocks: c.int(co, 'cpuBlocks', cp, 0, 0, 2 ** 31 - 1),
          diskBlocks: c.int(co, 'diskBlocks', cp, 0, 0, 2 ** 31 - 1),
        };
      }
      endpoints.push({ name: epName, url, role, ...(revision ? { revision } : {}), ...(capacity ? { capacity } : {}) });
    });
    pools.push({ name, engine, accelerator, models, endpoints });
  });

  const so = c.obj(doc.scheduling, 'scheduling', ['filters', 'scorers', 'picker', 'prefixBlockSize']);
  const specs = (key: 'filters' | 'scorers', def: PluginSpec[] | ScorerSpec[]) => {
    if (so[key] === undefined) return def.map((s) => ({ ...s, params: { ...s.params } }));
    const out: ScorerSpec[] = [];
    c.arr(so[key], `scheduling.${key}`, false).forEach((v, i) => {
      const s = pluginSpec(c, v, `scheduling.${key}[${i}]`, key === 'scorers');
      if (s) out.push(s);
    });
    return out;
  };
  const filters = specs('filters', DEFAULT_FILTERS).map(({ type, params }) => ({ type, params }));
  const scorers = specs('scorers', DEFAULT_SCORERS) as ScorerSpec[];
  // a decision carries one prefix-cache scorer's block counts (the request path uses them to
  // forget what a failed pick recorded): a second one would overwrite them
  const prefixAt = scorers.map((s, i) => (s.type === 'prefix-cache' ? i : -1)).filter((i) => i >= 0);
  if (prefixAt.length > 1) c.add(`scheduling.scorers[${prefixAt[1]}]`, 'at most one prefix-cache scorer (give it a larger weight instead)');
  let picker: PluginSpec = { type: DEFAULTS.scheduling.picker, params: {} };
  if (so.picker !== undefined) {
    const p = pluginSpec(c, so.picker, 'scheduling.picker', false);
    if (p) picker = { type: p.type, params: p.params };
  }
  const prefixBlockSize = c.int(so, 'prefixBlockSize', 'scheduling', DEFAULTS.scheduling.prefixBlockSize, 1, 1 << 20);
  if (validatePlugin) {
    filters.forEach((s, i) => validatePlugin('filter', s).forEach((m) => c.add(`scheduling.filters[${i}]`, m)));
    scorers.forEach((s, i) => validatePlugin('scorer', s).forEach((m) => c.add(`scheduling.scorers[${i}]`, m)));
    validatePlugin('picker', picker).forEach((m) => c.add('scheduling.picker', m));
  }

  const dl = c.obj(doc.dataLayer, 'dataLayer', Object.keys(DEFAULTS.dataLayer));
  const d = DEFAULTS.dataLayer;
  const dataLayer: DataLayerConfig = {
    scrapeIntervalMs: c.int(dl, 'scrapeIntervalMs', 'dataLayer', d.scrapeIntervalMs, 0, 3_600_000),
    staleAfterMs: c.int(dl, 'staleAfterMs', 'dataLayer', d.staleAfterMs, 1, 3_600_000),
    healthIntervalMs: c.int(dl, 'healthIntervalMs', 'dataLayer', d.healthIntervalMs, 0, 3_600_000),
    healthTimeoutMs: c.int(dl, 'healthTimeoutMs', 'dataLayer', d.healthTimeoutMs, 1, 3_600_000),
    breakerFailures: c.int(dl, 'breakerFailures', 'dataLayer', d.breakerFailures, 1, 1_000_000),
    breakerCooldownMs: c.int(dl, 'breakerCooldownMs', 'dataLayer', d.breakerCooldownMs, 1, 3_600_000),
  };
  const px = c.obj(doc.proxy, 'proxy', Object.keys(DEFAULTS.proxy));
  const p = DEFAULTS.proxy;
  const proxy: ProxyConfig = {
    client: c.oneOf(px, 'client', 'proxy', UPSTREAM_CLIENTS, p.client),
    maxRetries: c.int(px, 'maxRetries', 'proxy', p.maxRetries, 0, 10),
    connectionsPerEndpoint: c.int(px, 'connectionsPerEndpoint', 'proxy', p.connectionsPerEndpoint, 1, 65536),
    connectTimeoutMs: c.int(px, 'connectTimeoutMs', 'proxy', p.connectTimeoutMs, 1, 3_600_000),
    headersTimeoutMs: c.int(px, 'headersTimeoutMs', 'proxy', p.headersTimeoutMs, 1, 86_400_000),
    bodyTimeoutMs: c.int(px, 'bodyTimeoutMs', 'proxy', p.bodyTimeoutMs, 0, 86_400_000),
  };
  if (proxy.client === 'h1' || proxy.client === 'native') {
    pools.forEach((pool, i) =>
      pool.endpoints.forEach((e, j) => {
        if (e.url.startsWith('https:')) c.add(`pools[${i}].endpoints[${j}].url`, 'https endpoints need proxy.client: undici (or auto)');
        else if (proxy.client === 'native' && !hostIsAddress(e.url))
          c.add(`pools[${i}].endpoints[${j}].url`, 'proxy.client: native needs an IP address or localhost as host (it does no DNS lookups); use h1 or auto');
      }),
    );
  }
  const li = c.obj(doc.limits, 'limits', Object.keys(DEFAULTS.limits));
  const limits: LimitsConfig = {
    maxBodyBytes: c.int(li, 'maxBodyBytes', 'limits', DEFAULTS.limits.maxBodyBytes, 1, 2 ** 31 - 1),
    requestBodyTimeoutMs: c.int(li, 'requestBodyTimeoutMs', 'limits', DEFAULTS.limits.requestBodyTimeoutMs, 1, 3_600_000),
  };
  const lg = c.obj(doc.logging, 'logging', ['level']);
  const logging = { level: c.oneOf(lg, 'level', 'logging', LOG_LEVELS, DEFAULTS.logging.level) };

  if (c.issues.length > 0) throw new ConfigError(c.issues, source);
  const cfg: RouterConfig = { apiVersion: API_VERSION, kind: 'Router', listen, pools, scheduling: { filters, scorers, picker, prefixBlockSize }, dataLayer, proxy, limits, logging };
  if (doc.flowControl !== undefined) cfg.flowControl = doc.flowControl;
  return cfg;
}

/** An endpoint name derived from its URL (host:port), used when `name` is omitted. */
export function safeName(url: string): string {
  try {
    const u = new URL(url);
    return u.host;
  } catch {
    return url;
  }
}
