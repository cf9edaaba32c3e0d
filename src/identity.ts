// Who a request belongs to: the seam between the router and whatever knows
// tenants (API-key authentication, src/auth/; without it flow control's
// classifier). A leaf: imports nothing.

/** Reads a request header by its lower-case name ('' when absent). */
export type HeaderGetter = (name: string) => string;

/** Names the tenant of a request from its headers. */
export interface Identity {
  /** The request's tenant, or '' when it names none (or nothing knows tenants). */
  tenantOf(get: HeaderGetter): string;
}

/**
 * A request's resolved identity, decided once when the request arrives and
 * carried on its flight (the director's `Flight.caller`). One shared, frozen
 * object per key (and one per tenant without auth): compare by field, never
 * mutate. Rate limits key their counters by `keyId` and `tenant`.
 */
export interface Caller {
  /** The tenant: the owner of every object the request stores; '' = the anonymous scope. */
  readonly tenant: string;
  /** The key's id: the first 16 hex digits of its SHA-256 digest (never the key); '' = no key. */
  readonly keyId: string;
  /** The models this caller may use (others answer 404 model_not_found); null = every model. */
  readonly models: ReadonlySet<string> | null;
  /** The highest priority band the caller may use (a higher claim is clamped to it); '' = no ceiling. */
  readonly maxBand: string;
  /**
   * The fairness flow the caller is entitled to: `tenant:<name>` for a
   * tenant, `default` for an untrusted anonymous caller; '' = classify the
   * request's headers (no auth, or trusted headers without a tenant).
   */
  readonly flow: string;
  /** The key's own rate limits (src/limits/; the `auth` key's options); null = none of its own. */
  readonly limits: KeyLimits | null;
}

/** A key's rate limits (config/rate-limits.ts's LimitSpec, structurally); an absent field is no limit of its own. */
export interface KeyLimits {
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
  readonly tokensPerDay?: number;
}

/** A request refused by authentication: 401 with this message (code invalid_api_key). */
export interface Refusal {
  readonly refused: string;
}

export function isRefusal(r: Caller | Refusal): r is Refusal {
  return (r as Refusal).refused !== undefined;
}

/** The caller of a request nothing identifies (no auth, no tenant). */
export const ANONYMOUS: Caller = Object.freeze({ tenant: '', keyId: '', models: null, maxBand: '', flow: '', limits: null });

/** Resolves the caller of a request from its headers; a Refusal when authentication requires a key it did not get. */
export interface Authenticator {
  authenticate(get: HeaderGetter): Caller | Refusal;
}
