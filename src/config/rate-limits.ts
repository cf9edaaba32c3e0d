// The `rateLimits` block of the router config: requests per minute, tokens
// per minute and tokens per UTC day for interactive traffic, per tenant (here)
// and per API key (the key's own options in the `auth` block: key lines'
// `rpm=` `tpm=` `tpd=`, inline keys' requestsPerMinute / tokensPerMinute /
// tokensPerDay). Counters are this router's own, or shared by several routers
// in Redis (`redis`). docs/config.md and docs/security.md ("Rate limits")
// document each field; src/limits/ enforces them.
import { FLOW_ID_RE } from './flow-control.js';
import { ALWAYS, int, isMapping, nonEmpty, oneOf, strict, z } from './schema-kit.js';

/** One subject's limits (a tenant's or a key's); an absent field is no limit. */
export interface LimitSpec {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
  tokensPerDay?: number;
}

export interface RateLimitsRedisConfig {
  /** redis:// or rediss:// URL. */
  url: string;
  /** Prefix of every counter key. */
  keyPrefix: string;
  /** A command that takes longer fails (then `failMode` decides). */
  timeoutMs: number;
  /** Redis down or slow: `open` admits (counted locally meanwhile), `closed` answers 503. */
  failMode: 'open' | 'closed';
}

export interface RateLimitsConfig {
  /** Limits per tenant, by tenant id. */
  tenants: Record<string, LimitSpec>;
  /** Limits of each tenant not listed in `tenants` (each counted on its own); absent: none. */
  defaultTenant?: LimitSpec;
  /** Limits of the anonymous scope (requests with no known tenant, all together); absent: none. */
  anonymous?: LimitSpec;
  /** Limits of each key without its own (key options win field by field); absent: none. */
  defaultKey?: LimitSpec;
  /** Counters shared by several routers; absent: this router counts alone. */
  redis?: RateLimitsRedisConfig;
  /** Keys and tenants with counters of their own in this router; later ones share an `(overflow)` counter. Absent: 100,000. */
  maxSubjects?: number;
}

export const RATE_LIMIT_DEFAULTS = { keyPrefix: 'switchyard:rl:', timeoutMs: 50, failMode: 'open' as const, maxSubjects: 100_000 };

const MAX = 1_000_000_000_000;
export const limitSpecSchema = strict(
  {
    requestsPerMinute: int(1, MAX).optional().describe('requests a minute (a burst of this many, refilled evenly)'),
    tokensPerMinute: int(1, MAX).optional().describe('prompt + completion tokens a minute (the prompt estimated at admission, corrected by the usage)'),
    tokensPerDay: int(1, MAX).optional().describe('prompt + completion tokens per UTC day'),
  },
  'must be a mapping {requestsPerMinute, tokensPerMinute, tokensPerDay}',
);

const tenantMsg = 'must be a tenant id (1-128 of A-Z a-z 0-9 . _ : @ / -)';

export const rateLimitsSchema = strict(
  {
    tenants: z
      .record(z.string(), limitSpecSchema, { error: 'must be a mapping of tenant id → {requestsPerMinute, tokensPerMinute, tokensPerDay}' })
      .default({})
      .describe('limits per tenant'),
    defaultTenant: limitSpecSchema.optional().describe('limits of each tenant not listed in tenants'),
    anonymous: limitSpecSchema.optional().describe('limits of the anonymous scope (no known tenant), all such requests together'),
    defaultKey: limitSpecSchema.optional().describe("limits of each API key without its own (a key's options win field by field)"),
    redis: strict(
      {
        url: nonEmpty()
          .refine((s) => /^rediss?:\/\//.test(s), { error: 'must be a redis:// or rediss:// URL' })
          .describe('the Redis the routers share their counters in'),
        keyPrefix: nonEmpty().default(RATE_LIMIT_DEFAULTS.keyPrefix),
        timeoutMs: int(1, 60_000).default(RATE_LIMIT_DEFAULTS.timeoutMs).describe('a counter command that takes longer fails (failMode decides)'),
        failMode: oneOf(['open', 'closed'] as const).default(RATE_LIMIT_DEFAULTS.failMode).describe('Redis down: open admits (counted locally), closed answers 503'),
      },
      'must be a mapping {url, keyPrefix, timeoutMs, failMode}',
    )
      .optional()
      .describe('counters shared by several routers; absent = counted by this router alone'),
    maxSubjects: int(1, 10_000_000)
      .default(RATE_LIMIT_DEFAULTS.maxSubjects)
      .describe('keys and tenants with counters of their own in this router (idle ones are dropped first); later ones share an (overflow) counter per kind'),
  },
  'must be a mapping',
)
  .superRefine((v, ctx) => {
    if (!isMapping(v) || !isMapping(v.tenants)) return;
    for (const t of Object.keys(v.tenants)) if (!FLOW_ID_RE.test(t)) ctx.addIssue({ code: 'custom', path: ['tenants', t], message: `the key ${tenantMsg}`, input: undefined });
  }, ALWAYS)
  .transform((v): RateLimitsConfig => {
    const out: RateLimitsConfig = { tenants: v.tenants, maxSubjects: v.maxSubjects };
    if (v.defaultTenant !== undefined) out.defaultTenant = v.defaultTenant;
    if (v.anonymous !== undefined) out.anonymous = v.anonymous;
    if (v.defaultKey !== undefined) out.defaultKey = v.defaultKey;
    if (v.redis !== undefined) out.redis = v.redis;
    return out;
  });

/** True when `s` limits something. */
export function limits(s: LimitSpec | undefined | null): s is LimitSpec {
  return s != null && (s.requestsPerMinute !== undefined || s.tokensPerMinute !== undefined || s.tokensPerDay !== undefined);
}
