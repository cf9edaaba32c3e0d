// API-key authentication: the Authorization header's bearer token → the
// caller (tenant, key id, allowed models, band ceiling). The key table holds
// SHA-256 digests only: a presented token is hashed, its digest looked up by
// its first 48 bits, and compared whole in constant time (timingSafeEqual).
// Nothing here logs or exports a key or a digest; a key is named by its id
// (the digest's first 16 hex digits). Built from the validated config and the
// key lines (keys.ts); replaced whole on a config reload, so a removed key is
// refused at once while requests that already resolved their caller finish.
import * as crypto from 'node:crypto';
import { timingSafeEqual } from 'node:crypto';
import type { AuthConfig, AuthKeyConfig } from '../config/auth.js';
import { ANONYMOUS, type Authenticator, type Caller, type HeaderGetter, type Identity, type Refusal } from '../identity.js';

/** Tokens longer than this are refused unhashed (a real key is well under it). */
const MAX_TOKEN = 4096;
const ID_RE = /^[A-Za-z0-9._:@/-]{1,128}$/;

/**
 * SHA-256 of an ASCII token: crypto.hash (one call, no Hash object: about five
 * times cheaper than createHash on Node 20) where Node has it.
 */
const sha256: (token: string) => Buffer =
  typeof (crypto as { hash?: unknown }).hash === 'function'
    ? (token) => (crypto as unknown as { hash(alg: string, data: string, enc: 'buffer'): Buffer }).hash('sha256', token, 'buffer')
    : (token) => crypto.createHash('sha256').update(token, 'latin1').digest();

/** The cache's spelling of an Authorization value: `Bearer <token>`. */
const BEARER_PREFIX = 'Bearer ';
/** "bearer" as char codes, lower case. */
const BEARER = [0x62, 0x65, 0x61, 0x72, 0x65, 0x72];

const MISSING: Refusal = Object.freeze({
  refused: 'You did not provide an API key: send it as "Authorization: Bearer <key>".',
});
const MALFORMED: Refusal = Object.freeze({
  refused: 'The Authorization header is not "Bearer <key>".',
});
const UNKNOWN: Refusal = Object.freeze({ refused: 'Incorrect API key provided.' });

interface KeyEntry {
  readonly digest: Buffer;
  readonly caller: Caller;
}

/** The bearer token of an Authorization value, '' when there is none, null when the value is not `Bearer <token>`. */
export function bearerToken(auth: string): string | null {
  if (auth === '') return '';
  let i = 0;
  const n = auth.length;
  while (i < n && (auth.charCodeAt(i) === 32 || auth.charCodeAt(i) === 9)) i++;
  // "bearer" in any case, then at least one space
  if (n - i < 8) return null;
  for (let j = 0; j < 6; j++) if ((auth.charCodeAt(i + j) | 0x20) !== BEARER[j]) return null;
  i += 6;
  const c = auth.charCodeAt(i);
  if (c !== 32 && c !== 9) return null;
  while (i < n && (auth.charCodeAt(i) === 32 || auth.charCodeAt(i) === 9)) i++;
  let end = n;
  while (end > i && (auth.charCodeAt(end - 1) === 32 || auth.charCodeAt(end - 1) === 9)) end--;
  if (end === i || end - i > MAX_TOKEN) return null;
  for (let j = i; j < end; j++) {
    const ch = auth.charCodeAt(j);
    // visible ASCII only (RFC 6750's b64token is a subset): the digest is of these bytes
    if (ch <= 32 || ch >= 127) return null;
  }
  return i === 0 && end === n ? auth : auth.slice(i, end);
}

export class ApiKeyAuthenticator implements Authenticator, Identity {
  readonly required: boolean;
  readonly trustHeaders: boolean;
  /** Keys by the first 48 bits of their digest (a bucket per value; collisions only between distinct digests). */
  readonly #keys = new Map<number, KeyEntry | KeyEntry[]>();
  /** Callers by key id (the admin API's key listing). */
  readonly callers: readonly Caller[];
  readonly #anonymous: Caller;
  /**
   * Known tokens → their caller, so a key's SHA-256 is computed once, not per
   * request. Keyed by the header value as clients send it, `Bearer <token>`
   * (one space, "Bearer" capitalised: what the OpenAI SDKs send), so a
   * request in that form is one Map lookup of the header string, with no
   * parse and no token string sliced out of it; another spelling of the
   * header is parsed and looked up under that form (one entry per key
   * whatever the spelling). Only tokens that matched a key go in (an unknown
   * token is hashed every time and never stored: random tokens from a
   * hostile client cannot grow it or push a real key out), so it holds at
   * most one entry per key and needs no eviction; `maxCached` bounds it
   * anyway. Replaced whole with the authenticator on a reload: a removed
   * key's token is gone with it. Cost: the plaintext of keys in use stays in
   * this process's memory (it passes through it on every request anyway); a
   * lookup is a Map hash of the header string (V8's hash is seeded per
   * process).
   */
  readonly #cache = new Map<string, Caller>();
  readonly #maxCached: number;

  constructor(cfg: Pick<AuthConfig, 'required' | 'trustHeaders'>, keys: readonly AuthKeyConfig[]) {
    this.required = cfg.required;
    this.trustHeaders = cfg.trustHeaders;
    this.#anonymous = cfg.trustHeaders ? ANONYMOUS : Object.freeze({ ...ANONYMOUS, flow: 'default' });
    const callers: Caller[] = [];
    for (const k of keys) {
      const digest = Buffer.from(k.digest, 'hex');
      const caller: Caller = Object.freeze({
        tenant: k.tenant,
        keyId: k.digest.slice(0, 16),
        models: k.models ? new Set(k.models) : null,
        maxBand: k.maxBand ?? '',
        flow: `tenant:${k.tenant}`,
        limits:
          k.requestsPerMinute !== undefined || k.tokensPerMinute !== undefined || k.tokensPerDay !== undefined
            ? Object.freeze({ requestsPerMinute: k.requestsPerMinute, tokensPerMinute: k.tokensPerMinute, tokensPerDay: k.tokensPerDay })
            : null,
      });
      callers.push(caller);
      const e: KeyEntry = { digest, caller };
      const slot = digest.readUIntBE(0, 6);
      const had = this.#keys.get(slot);
      this.#keys.set(slot, had === undefined ? e : Array.isArray(had) ? [...had, e] : [had, e]);
    }
    this.callers = callers;
    this.#maxCached = Math.max(16, callers.length);
  }

  get size(): number {
    return this.callers.length;
  }

  /** Tokens remembered (known keys only). */
  get cached(): number {
    return this.#cache.size;
  }

  authenticate(get: HeaderGetter): Caller | Refusal {
    const auth = get('authorization');
    // the common case: `Bearer <a known key>`, exactly as it was the first time (the cache's key)
    let caller = this.#cache.get(auth) ?? null;
    if (caller === null) {
      const token = bearerToken(auth);
      if (token === null) {
        if (this.required) return MALFORMED;
      } else if (token === '') {
        if (this.required) return MISSING;
      } else {
        caller = this.#lookup(auth, token);
        if (caller === null && this.required) return UNKNOWN;
      }
    }
    if (this.trustHeaders) {
      // a gateway in front vouches for the tenant it names; the key's models and band ceiling still apply
      const t = get('x-tenant-id');
      if (t !== '' && ID_RE.test(t) && t !== caller?.tenant) return Object.freeze({ ...(caller ?? ANONYMOUS), tenant: t, flow: `tenant:${t}` });
    }
    return caller ?? this.#anonymous;
  }

  tenantOf(get: HeaderGetter): string {
    const r = this.authenticate(get);
    return (r as Caller).tenant ?? '';
  }

  /** The caller of `token` (of the header value `auth`, not found in the cache as it is). */
  #lookup(auth: string, token: string): Caller | null {
    const key = BEARER_PREFIX + token;
    if (key !== auth) {
      const known = this.#cache.get(key);
      if (known !== undefined) return known;
    }
    const c = this.#match(token);
    if (c !== null && this.#cache.size < this.#maxCached) this.#cache.set(key, c);
    return c;
  }

  #match(token: string): Caller | null {
    const digest = sha256(token);
    const hit = this.#keys.get(digest.readUIntBE(0, 6));
    if (hit === undefined) return null;
    if (!Array.isArray(hit)) return timingSafeEqual(hit.digest, digest) ? hit.caller : null;
    for (const e of hit) if (timingSafeEqual(e.digest, digest)) return e.caller;
    return null;
  }
}
