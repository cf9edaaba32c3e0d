// Batch quotas (batch.quotas; docs/batch.md, "Quotas") on the counters the
// interactive rate limits use (src/limits/): a tenant's quota is one subject,
// `b:<tenant>`, whose GCRA period is the quota's window (`windowMs`): its
// `requests` and `tokens` a window are a burst of the window's budget,
// refilled evenly. A line is checked and charged when it is dispatched (on
// shared counters one Lua script, one round trip: a refused line charges
// nothing); its tokens are the entry's estimate (prompt bytes ÷ 4 +
// max_tokens), corrected to the engine's usage once its answer is in; a line
// the interactive rate limits defer after its quota admitted it gets both
// back (the processor, not a client, sends it again).
//
// Which counters (src/server/assemble.ts decides): the router's
// `rateLimits.redis` when it has one (one store for every limit, and its
// failMode), else the batch Redis (`batch.redis`, keys
// `<batch.keyPrefix>:rl:b:<tenant>`); either way every router of the group
// shares them. A limiter without shared counters counts in this process.
import type { BatchConfig } from '../config/batch.js';
import { DAY_MS } from '../limits/bucket.js';
import { Take, type Plan, type RateLimiter } from '../limits/limiter.js';

/** What a dispatched line was charged: corrected by its answer's usage, or its tokens given back. */
export interface QuotaCharge {
  readonly plan: Plan;
  readonly cost: number;
  /** The UTC day it was charged on. */
  readonly day: number;
}

export class BatchQuotas {
  readonly limiter: RateLimiter;
  readonly #cfg: BatchConfig['quotas'];

  constructor(cfg: BatchConfig['quotas'], limiter: RateLimiter) {
    this.#cfg = cfg;
    this.limiter = limiter;
  }

  /** True when some tenant has a quota (otherwise no counters are needed). */
  static configured(q: BatchConfig['quotas']): boolean {
    if (q.default.requests > 0 || q.default.tokens > 0) return true;
    for (const t of Object.values(q.tenants)) if (t.requests > 0 || t.tokens > 0) return true;
    return false;
  }

  /** Lines refused by a quota (switchyard_rate_limited_total{limit="batch-quota"}). */
  get refused(): number {
    return this.limiter.refusedRequests + this.limiter.refusedTokens;
  }

  /**
   * Checks and charges one line of `tenant` estimated at `tokens`: its charge,
   * null when the tenant has no quota, false when the quota refuses it
   * (nothing is charged). Throws when the shared counters are down and their
   * fail mode is closed (the line waits, as for any Redis failure).
   */
  async take(tenant: string, tokens: number): Promise<QuotaCharge | null | false> {
    const q = this.#cfg;
    const lim = Object.hasOwn(q.tenants, tenant) ? q.tenants[tenant]! : q.default;
    const l = this.limiter;
    const plan = l.subject(`b:${tenant}`, tenant === '' ? 'batch quota of the anonymous scope' : `batch quota of tenant ${tenant}`, lim.requests, lim.tokens, q.windowMs);
    if (plan === null) return null;
    const cost = plan.tokens ? tokens : 0;
    if (l.shared === null) {
      const now = Date.now();
      return l.takeLocal(plan, cost, now) ? { plan, cost, day: Math.floor(now / DAY_MS) } : false;
    }
    const day = Math.floor(Date.now() / DAY_MS);
    const r = await l.take(plan, cost);
    if (r === Take.Refused) return false;
    if (r === Take.Down) {
      if (l.failClosed) {
        l.failedClosed++;
        throw new Error('the batch quota counters are unavailable (failMode: closed)');
      }
      // fail open: this router's own copy decides meanwhile
      l.failedOpen++;
      if (!l.takeLocal(plan, cost, Date.now())) return false;
    }
    return { plan, cost, day };
  }

  /** The line's answer is in: its charge becomes `used` tokens (undefined: no usage known, the estimate stays). */
  settle(c: QuotaCharge, used: number | undefined): void {
    if (used !== undefined && c.plan.tokens) this.limiter.correct(c.plan, used - c.cost, c.day);
  }

  /** The line was not run (the interactive limits deferred it; the processor dispatches it again later): its request and its tokens go back. */
  giveBack(c: QuotaCharge): void {
    this.limiter.giveBack(c.plan, c.cost, c.day);
  }
}

/**
 * The tokens a line's answer used: its `usage` (total_tokens, else prompt +
 * completion, else a Responses answer's input + output; only non-negative
 * integers count: an engine's figure is not trusted); an error answer
 * without usage used none; undefined when there is no usage to read (a
 * streamed answer's SSE text): the estimate stays.
 */
export function usageOf(status: number, body: string): number | undefined {
  let u: unknown;
  try {
    u = (JSON.parse(body) as { usage?: unknown } | null)?.usage;
  } catch {
    u = undefined;
  }
  if (u !== null && typeof u === 'object') {
    const x = u as Record<string, unknown>;
    // an engine's count, not trusted: a negative, fractional or absurd number would refund a tenant's quota
    const count = (v: unknown): number | undefined => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : undefined);
    const total = count(x.total_tokens);
    if (total !== undefined) return total;
    const a = count(x.prompt_tokens) ?? count(x.input_tokens);
    const b = count(x.completion_tokens) ?? count(x.output_tokens) ?? 0;
    if (a !== undefined) return a + b;
  }
  return status >= 400 ? 0 : undefined;
}
