// Per-request classification: which flow (fairness id) and which priority
// band. Pure functions over a header getter, so the server can pass whatever
// header access it has without building objects per request.
import type { FlowControlConfig } from './config.js';

/** Returns a request header's value by lower-case name; '' or undefined when absent. */
export type HeaderGetter = (name: string) => string | undefined;

/** The headers classification reads (lower-case). */
export const CLASSIFY_HEADERS = [
  'authorization',
  'x-tenant-id',
  'x-llm-d-inference-fairness-id',
  'x-workload-id',
  'x-priority',
] as const;

/** Flow id of requests that carry no identity at all. */
export const ANONYMOUS_FLOW = 'default';

const ID_RE = /^[A-Za-z0-9._:@/-]{1,128}$/;

export interface Classification {
  flowId: string;
  /** Band index: 0 is the highest priority. */
  band: number;
}

/** Precomputed lookups for classify(); build once per config. */
export class Classifier {
  readonly bands: readonly string[];
  readonly defaultBand: number;
  readonly #bandIndex = new Map<string, number>();
  readonly #declared = new Map<string, number>();
  readonly #tenants: Map<string, string>;
  readonly #trustHeaders: boolean;

  constructor(cfg: FlowControlConfig) {
    this.bands = cfg.bands;
    cfg.bands.forEach((b, i) => this.#bandIndex.set(b, i));
    this.defaultBand = this.#bandIndex.get(cfg.defaultBand) ?? 0;
    this.#tenants = new Map(Object.entries(cfg.tenants).map(([key, tenant]) => [key, `tenant:${tenant}`]));
    this.#trustHeaders = cfg.trustHeaders;
    // Untrusted headers may lower a request's band, never raise it: only an id
    // proven by an API key keeps a declared band above the default one; any
    // other id (it came from a header, or is anonymous) is held at the default
    // band or below. Precomputed, so band() stays one lookup.
    const keyed = new Set(this.#tenants.values());
    for (const f of cfg.flows) {
      const declared = this.#bandIndex.get(f.priority) ?? this.defaultBand;
      this.#declared.set(f.id, this.#trustHeaders || keyed.has(f.id) ? declared : Math.max(declared, this.defaultBand));
    }
  }

  /** The fairness id of a request. */
  flowId(get: HeaderGetter): string {
    const auth = get('authorization');
    if (auth && this.#tenants.size > 0) {
      const tenant = this.#tenantOfAuth(auth);
      if (tenant !== '') return tenant;
    }
    if (this.#trustHeaders) {
      const t = get('x-tenant-id');
      if (t) {
        const id = this.#prefixed(this.#tenantIds, 'tenant:', t);
        if (id !== undefined) return id;
      }
    }
    const fid = get('x-llm-d-inference-fairness-id');
    // An untrusted client must not claim a tenant's identity through another header.
    if (fid && ID_RE.test(fid) && (this.#trustHeaders || !fid.startsWith('tenant:'))) return fid;
    const w = get('x-workload-id');
    if (w) {
      const id = this.#prefixed(this.#workloadIds, 'workload:', w);
      if (id !== undefined) return id;
    }
    return ANONYMOUS_FLOW;
  }

  // Authorization header -> tenant flow id ('' for no mapped key), cached like the ids below.
  readonly #authTenants = new Map<string, string>();

  #tenantOfAuth(auth: string): string {
    const hit = this.#authTenants.get(auth);
    if (hit !== undefined) return hit;
    const m = /^\s*Bearer\s+(\S+)\s*$/i.exec(auth);
    const tenant = (m && this.#tenants.get(m[1]!)) ?? '';
    if (this.#authTenants.size >= 4096) this.#authTenants.clear();
    this.#authTenants.set(auth, tenant);
    return tenant;
  }

  // Header value -> prefixed flow id, cached so repeat callers cost a lookup
  // instead of a regex test and a string concatenation. Bounded: cleared when full.
  readonly #tenantIds = new Map<string, string>();
  readonly #workloadIds = new Map<string, string>();

  #prefixed(cache: Map<string, string>, prefix: string, v: string): string | undefined {
    const hit = cache.get(v);
    if (hit !== undefined) return hit;
    if (!ID_RE.test(v)) return undefined;
    if (cache.size >= 4096) cache.clear();
    const id = prefix + v;
    cache.set(v, id);
    return id;
  }

  /**
   * The band a flow was declared with (the default band when undeclared);
   * with untrusted headers, no higher than the default band unless an API key
   * maps to the flow.
   */
  declaredBand(flowId: string): number {
    return this.#declared.get(flowId) ?? this.defaultBand;
  }

  /** Band index of a band name, or -1. */
  bandIndex(name: string): number {
    return this.#bandIndex.get(name) ?? -1;
  }

  /** Full classification: x-priority may lower the band, never raise it above the flow's declared band. */
  classify(get: HeaderGetter): Classification {
    const flowId = this.flowId(get);
    return { flowId, band: this.band(flowId, get('x-priority')) };
  }

  /** Band for a flow given an x-priority header value ('' / undefined / unknown = the declared band). */
  band(flowId: string, priority: string | undefined): number {
    const declared = this.declaredBand(flowId);
    if (!priority) return declared;
    // exact names need no new string; others are normalised (' Batch' -> 'batch')
    const asked = this.#bandIndex.get(priority) ?? this.#bandIndex.get(priority.trim().toLowerCase());
    if (asked === undefined) return declared;
    return asked > declared ? asked : declared;
  }
}
