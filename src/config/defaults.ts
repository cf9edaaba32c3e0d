// The Router config's defaults (what an absent field becomes) and the URL and
// address helpers the schema and the router share.
import { ADMIN_DEFAULTS } from './admin.js';
import { DISAGGREGATION_DEFAULTS } from './disaggregation.js';
import { DEFAULT_PICKER, type PluginSpec, type ScorerSpec } from './plugin-spec.js';
import type { DataLayerConfig, LimitsConfig, ProxyConfig, UPSTREAM_CLIENTS } from './types.js';

export const DEFAULT_SCORERS: ScorerSpec[] = [
  { type: 'prefix-cache', weight: 3, params: {} },
  { type: 'queue', weight: 2, params: {} },
  { type: 'kv-cache-utilization', weight: 2, params: {} },
];
export const DEFAULT_FILTERS: PluginSpec[] = [
  { type: 'model', params: {} },
  { type: 'healthy', params: {} },
  { type: 'role', params: {} },
  // last: it narrows to a session's pinned endpoint among those that passed (a request without a session key passes untouched)
  { type: 'session-affinity', params: {} },
];

export const DEFAULTS = {
  listen: { host: '127.0.0.1', port: 8000 },
  scheduling: { picker: DEFAULT_PICKER, prefixBlockSize: 64 },
  dataLayer: {
    scrapeIntervalMs: 50,
    staleAfterMs: 2000,
    healthIntervalMs: 1000,
    healthTimeoutMs: 1000,
    breakerFailures: 3,
    breakerCooldownMs: 5000,
    modelCheckIntervalMs: 30_000,
  } satisfies DataLayerConfig,
  proxy: {
    client: 'auto' as (typeof UPSTREAM_CLIENTS)[number],
    maxRetries: 2,
    connectionsPerEndpoint: 256,
    connectTimeoutMs: 2000,
    headersTimeoutMs: 300_000,
    bodyTimeoutMs: 300_000,
  } satisfies ProxyConfig,
  limits: {
    maxBodyBytes: 16 * 1024 * 1024,
    requestBodyTimeoutMs: 30_000,
    maxJsonDepth: 128,
    parseOffloadBytes: 256 * 1024,
    parseWorkers: 2,
    bodyScan: 'native' as const,
  } satisfies LimitsConfig,
  logging: { level: 'info' as const, access: false, accessSample: 1 },
  shutdown: { graceMs: 120_000, drainDelayMs: 0 },
  admin: ADMIN_DEFAULTS,
  disaggregation: DISAGGREGATION_DEFAULTS,
};

/** True for a loopback listen address (127.0.0.0/8, ::1, localhost). */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h) || h === '::ffff:127.0.0.1';
}

/**
 * The origin (`scheme://host[:port]`, scheme lower-cased) of an http(s) URL
 * without path, query, fragment or credentials, or null. The clients and the
 * data layer take the stored URL as is: `HTTP://h` failed in an upstream client,
 * and a `#fragment` made the data layer's undici client throw at startup.
 */
export function httpOrigin(s: string): string | null {
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

/**
 * The port written in an http(s) URL when it is not a port (not digits, or
 * above 65535: WHATWG URL refuses both), else null; lets the URL message name
 * the port instead of the whole URL's shape.
 */
export function badUrlPort(s: string): string | null {
  const m = /^https?:\/\/(?:[^/?#@]*@)?(?:\[[^\]]*\]|[^/?#:[]*):([^/?#]*)/i.exec(s);
  if (m === null || m[1] === '') return null;
  const p = m[1]!;
  return /^\d+$/.test(p) && Number(p) <= 65535 ? null : p;
}

/** Control characters (C0 and DEL): not allowed in an endpoint name, which goes into a response header. */
export const CONTROL_CHARS = /[\x00-\x1f\x7f]/;

/** An endpoint name derived from its URL (host:port), used when `name` is omitted. */
export function safeName(url: string): string {
  try {
    const u = new URL(url);
    return u.host;
  } catch {
    return url;
  }
}

/** A URL for a message: its password (redis://:secret@host) replaced by ***. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password !== '') u.password = '***';
    return u.toString().replace(/\/$/, '');
  } catch {
    return '(unparsable URL)';
  }
}
