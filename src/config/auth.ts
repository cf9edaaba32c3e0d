// The `auth` block of the router config: API keys (as SHA-256 digests) →
// tenant, per-key model allow-lists and band ceilings, whether a key is
// required, whether identity headers are believed (docs/security.md). Type,
// defaults, zod schema, and the parser of the key-line format that a keys
// file and a keys environment variable share, so `check` and `serve` apply
// the same rules. Reading the file and the variable is src/auth/keys.ts.
import type { ConfigIssue } from '../errors.js';
import { FLOW_ID_RE } from './flow-control.js';
import { ALWAYS, int, isMapping, nonEmpty, strict, z } from './schema-kit.js';

const LIMIT_MAX = 1_000_000_000_000;
/** Key-line options naming a rate limit, and the field each sets. */
const LIMIT_OPTIONS: Record<string, 'requestsPerMinute' | 'tokensPerMinute' | 'tokensPerDay'> = { rpm: 'requestsPerMinute', tpm: 'tokensPerMinute', tpd: 'tokensPerDay' };

export interface AuthKeyConfig {
  /** SHA-256 of the key, 64 hex digits (lower case once validated). */
  digest: string;
  tenant: string;
  /** The models the key may use; absent = every model. */
  models?: string[];
  /** The highest priority band the key may use; absent = no ceiling. */
  maxBand?: string;
  /** The key's own rate limits (key lines: `rpm=` `tpm=` `tpd=`); absent = rateLimits.defaultKey's, if any. */
  requestsPerMinute?: number;
  tokensPerMinute?: number;
  tokensPerDay?: number;
}

export interface AuthConfig {
  /** A request without a known key is answered 401 (false: it is served as the anonymous caller). */
  required: boolean;
  /** Inline keys. */
  keys: AuthKeyConfig[];
  /** A file of key lines (`digest tenant [models=a,b] [maxBand=band] [rpm=N] [tpm=N] [tpd=N]`), read at start and on every reload. */
  keysFile?: string;
  /** An environment variable holding key lines (newline- or `;`-separated), read at start and on every reload. */
  keysEnv?: string;
  /** Believe `x-tenant-id` and the other identity headers (a gateway in front authenticated them). */
  trustHeaders: boolean;
}

export const DIGEST_RE = /^[0-9a-fA-F]{64}$/;
const digestMsg = 'must be the SHA-256 digest of the key: 64 hex digits (e.g. `printf %s "$KEY" | sha256sum`)';
const tenantMsg = 'must be a tenant id (1-128 of A-Z a-z 0-9 . _ : @ / -)';

const keySchema = strict(
  {
    digest: z.string({ error: (i) => (i.input === undefined ? 'is required' : digestMsg) }).regex(DIGEST_RE, { error: digestMsg }),
    tenant: z.string({ error: (i) => (i.input === undefined ? 'is required' : tenantMsg) }).regex(FLOW_ID_RE, { error: tenantMsg }),
    models: z.array(nonEmpty(), { error: 'must be a list of model names' }).min(1, { error: 'must list at least one model (leave it out for every model)' }).optional(),
    maxBand: nonEmpty().optional().describe('the highest priority band this key may use'),
    requestsPerMinute: int(1, LIMIT_MAX).optional().describe("this key's requests a minute (rateLimits)"),
    tokensPerMinute: int(1, LIMIT_MAX).optional().describe("this key's tokens a minute (rateLimits)"),
    tokensPerDay: int(1, LIMIT_MAX).optional().describe("this key's tokens per UTC day (rateLimits)"),
  },
  'must be a mapping {digest, tenant, models, maxBand, requestsPerMinute, tokensPerMinute, tokensPerDay}',
);

export const authSchema = strict(
  {
    required: z.boolean({ error: 'must be true or false' }).default(true).describe('answer 401 to a request without a known key'),
    keys: z.array(keySchema, { error: 'must be a list of {digest, tenant, models, maxBand}' }).default([]),
    keysFile: nonEmpty().optional().describe('a file of key lines: digest tenant [models=a,b] [maxBand=band]'),
    keysEnv: nonEmpty().optional().describe('an environment variable holding key lines (newline- or ;-separated)'),
    trustHeaders: z.boolean({ error: 'must be true or false' }).default(false).describe('believe x-tenant-id and the other identity headers (a gateway in front authenticates)'),
  },
  'must be a mapping',
)
  .superRefine((v, ctx) => {
    if (!isMapping(v)) return;
    if ((!Array.isArray(v.keys) || v.keys.length === 0) && v.keysFile === undefined && v.keysEnv === undefined)
      ctx.addIssue({ code: 'custom', path: ['keys'], message: 'auth needs its keys: keys, keysFile or keysEnv', input: undefined });
    const seen = new Map<string, number>();
    if (Array.isArray(v.keys)) {
      v.keys.forEach((k, i) => {
        if (!isMapping(k) || typeof k.digest !== 'string' || !DIGEST_RE.test(k.digest)) return;
        const d = k.digest.toLowerCase();
        const first = seen.get(d);
        if (first !== undefined) ctx.addIssue({ code: 'custom', path: ['keys', i, 'digest'], message: `duplicate digest: the same key as auth.keys[${first}]`, input: undefined });
        else seen.set(d, i);
      });
    }
  }, ALWAYS)
  .transform((v): AuthConfig => {
    const out: AuthConfig = {
      required: v.required,
      keys: v.keys.map((k) => ({
        digest: k.digest.toLowerCase(),
        tenant: k.tenant,
        ...(k.models ? { models: k.models } : {}),
        ...(k.maxBand ? { maxBand: k.maxBand } : {}),
        ...(k.requestsPerMinute !== undefined ? { requestsPerMinute: k.requestsPerMinute } : {}),
        ...(k.tokensPerMinute !== undefined ? { tokensPerMinute: k.tokensPerMinute } : {}),
        ...(k.tokensPerDay !== undefined ? { tokensPerDay: k.tokensPerDay } : {}),
      })),
      trustHeaders: v.trustHeaders,
    };
    if (v.keysFile !== undefined) out.keysFile = v.keysFile;
    if (v.keysEnv !== undefined) out.keysEnv = v.keysEnv;
    return out;
  });

/** One key with where it was written (`auth.keys[2]`, `auth.keysFile line 7`), for messages naming both places of a duplicate. */
export interface PlacedKey extends AuthKeyConfig {
  readonly at: string;
}

/**
 * Parses key lines: `digest tenant [models=a,b] [maxBand=band]`, one per line
 * (`;` also ends a line), blank lines and `#` comments skipped. `where` names
 * the source in issue paths (`auth.keysFile line 3`). A malformed line is an
 * issue with its line number; the key itself is never echoed (a digest only
 * by its first 8 digits).
 */
export function parseKeyLines(text: string, where: string): { keys: PlacedKey[]; issues: ConfigIssue[] } {
  const keys: PlacedKey[] = [];
  const issues: ConfigIssue[] = [];
  const lines = text.split(/\r?\n|;/);
  for (let n = 0; n < lines.length; n++) {
    const line = lines[n]!.replace(/#.*$/, '').trim();
    if (line === '') continue;
    const at = `${where} line ${n + 1}`;
    const bad = (message: string) => issues.push({ path: at, message });
    const [digest, tenant, ...opts] = line.split(/\s+/);
    if (!DIGEST_RE.test(digest!)) {
      bad(`the first field ${digestMsg} (a line is: digest tenant [models=a,b] [maxBand=band])`);
      continue;
    }
    if (tenant === undefined) {
      bad('the tenant is missing (a line is: digest tenant [models=a,b] [maxBand=band])');
      continue;
    }
    if (!FLOW_ID_RE.test(tenant)) {
      bad(`the tenant ${tenantMsg}, got ${JSON.stringify(tenant.slice(0, 64))}`);
      continue;
    }
    const key: PlacedKey = { at, digest: digest!.toLowerCase(), tenant };
    let ok = true;
    for (const opt of opts) {
      const eq = opt.indexOf('=');
      const name = eq > 0 ? opt.slice(0, eq) : opt;
      const value = eq > 0 ? opt.slice(eq + 1) : '';
      if (name === 'models' && value !== '' && !key.models) {
        const models = value.split(',');
        if (models.some((m) => m === '')) {
          bad(`models= must be a comma-separated list of model names, got ${JSON.stringify(value.slice(0, 64))}`);
          ok = false;
        } else key.models = models;
      } else if (name === 'maxBand' && value !== '' && key.maxBand === undefined) key.maxBand = value;
      else if (LIMIT_OPTIONS[name] !== undefined && value !== '' && key[LIMIT_OPTIONS[name]] === undefined) {
        const n = Number(value);
        if (!/^[0-9]+$/.test(value) || !(n >= 1 && n <= LIMIT_MAX)) {
          bad(`${name}= must be a whole number in [1, ${LIMIT_MAX}], got ${JSON.stringify(value.slice(0, 64))}`);
          ok = false;
        } else key[LIMIT_OPTIONS[name]] = n;
      } else {
        bad(`unknown or repeated option ${JSON.stringify(opt.slice(0, 64))} (options: models=a,b maxBand=band rpm=N tpm=N tpd=N)`);
        ok = false;
      }
    }
    if (ok) keys.push(key);
  }
  return { keys, issues };
}

/**
 * Every key of every source, checked together: a digest given twice is an
 * issue naming both places; a maxBand that is not one of `bands` names the
 * bands. Returns the issues (empty when the keys are good).
 */
export function checkKeys(keys: readonly PlacedKey[], bands: readonly string[]): ConfigIssue[] {
  const issues: ConfigIssue[] = [];
  const seen = new Map<string, string>();
  for (const k of keys) {
    const first = seen.get(k.digest);
    if (first !== undefined) issues.push({ path: k.at, message: `duplicate digest ${k.digest.slice(0, 8)}…: the same key as ${first}` });
    else seen.set(k.digest, k.at);
    if (k.maxBand !== undefined && !bands.includes(k.maxBand)) issues.push({ path: k.at, message: `maxBand ${JSON.stringify(k.maxBand)} is not a band (bands: ${bands.join(', ')})` });
  }
  return issues;
}
