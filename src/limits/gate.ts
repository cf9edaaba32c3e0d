// Rate limits as an admission gate around the router's own gate (flow
// control, or the pass-through one): a request is charged to its caller's
// key and tenant counters first (RateLimiter: here, or in Redis), refused
// with 429 rate_limit_exceeded and Retry-After when a limit is reached, and
// only then handed to the inner gate. A request the inner gate refuses gets
// its tokens back (its request count stays: a retry loop is still a request
// a minute). When the answer ends, the tokens charged at admission (the
// prompt's estimate: bytes / 4) are corrected to the answer's real count
// (the engine's usage, else an estimate from what was relayed). Built by
// src/server/assemble.ts when the config has a `rateLimits` block; the
// director never knows it is there.
import type { AbortLike, Admission, AdmissionGate, Admitted, FinishedRequest, Rejected, ReleaseOutcome, RequestInfo } from '../admission.js';
import type { Identity } from '../identity.js';
import type { FleetFlows } from '../flow/fleet-flows.js';
import { Counter, Gauge, type Registry } from 'prom-client';
import { scrapeCounter } from '../metrics/prom.js';
import { BYTES_PER_TOKEN, promptTokensOf } from '../flow/cost.js';
import { DAY_MS, Fail } from './bucket.js';
import { refusalMessage, Take, type Plan, type RateLimiter } from './limiter.js';

/**
 * The ticket of a request the limits charged: what release() corrects, and
 * the inner gate's ticket. It is its own admission (`admitted`, `ticket`:
 * itself), so an admitted request costs one object here, not two.
 */
class LimitTicket implements Admitted {
  readonly admitted = true as const;
  readonly ticket: LimitTicket;
  constructor(
    readonly inner: unknown,
    readonly plan: Plan,
    readonly cost: number,
    readonly day: number,
  ) {
    this.ticket = this;
  }
}

const STORE_DOWN: Rejected = Object.freeze({
  admitted: false as const,
  status: 503,
  message: 'The rate-limit counters are unavailable (rateLimits.redis, failMode: closed); try again shortly.',
  reason: 'rate-limit-store-down',
  retryAfterSeconds: 1,
});

export class RateLimitGate implements AdmissionGate {
  readonly inner: AdmissionGate;
  readonly limiter: RateLimiter;
  readonly headerNames: readonly string[];
  readonly identity?: Identity;
  /** Token limits read the answer's usage. */
  readonly wantsUsage = true;

  constructor(inner: AdmissionGate, limiter: RateLimiter) {
    this.inner = inner;
    this.limiter = limiter;
    this.headerNames = inner.headerNames;
    if (inner.identity !== undefined) this.identity = inner.identity;
  }

  admit(info: RequestInfo, signal: AbortLike): Admission | Promise<Admission> {
    const c = info.caller;
    const plan = c === undefined ? null : this.limiter.plan(c);
    if (plan === null) return this.inner.admit(info, signal);
    const cost = plan.tokens ? promptTokensOf(info.promptBytes, info.bodyBytes) : 0;
    const lim = this.limiter;
    if (lim.shared === null) {
      const now = Date.now();
      if (!lim.takeLocal(plan, cost, now)) return this.#refused();
      return this.#admitInner(info, signal, plan, cost, Math.floor(now / DAY_MS));
    }
    const day = Math.floor(Date.now() / DAY_MS);
    return lim.take(plan, cost).then((r) => {
      if (r === Take.Refused) return this.#refused();
      if (r === Take.Down) {
        if (lim.failClosed) {
          lim.failedClosed++;
          return STORE_DOWN;
        }
        // fail open: admitted; counted on this router's own copy meanwhile (the headers move)
        lim.failedOpen++;
        lim.takeLocal(plan, cost, Date.now());
      }
      return this.#admitInner(info, signal, plan, cost, day);
    });
  }

  #admitInner(info: RequestInfo, signal: AbortLike, plan: Plan, cost: number, day: number): Admission | Promise<Admission> {
    const a = this.inner.admit(info, signal);
    if (typeof (a as Promise<Admission>).then === 'function') return (a as Promise<Admission>).then((x) => this.#wrap(x, plan, cost, day));
    return this.#wrap(a as Admission, plan, cost, day);
  }

  #wrap(a: Admission, plan: Plan, cost: number, day: number): Admission {
    if (!a.admitted) {
      this.limiter.refund(plan, cost, day);
      return a;
    }
    return new LimitTicket(a.ticket, plan, cost, day);
  }

  #refused(): Rejected {
    const v = this.limiter.verdict;
    const tokens = v.fail !== Fail.Requests;
    const r: Rejected = {
      admitted: false,
      status: 429,
      message: refusalMessage(v),
      reason: tokens ? 'rate-limited-tokens' : 'rate-limited-requests',
      errorType: tokens ? 'tokens' : 'requests',
    };
    // a request that can never fit has no time to retry at
    if (v.retryMs !== Infinity) (r as { retryAfterSeconds?: number }).retryAfterSeconds = Math.max(1, Math.ceil(v.retryMs / 1000));
    return r;
  }

  release(ticket: unknown, outcome: ReleaseOutcome, request?: FinishedRequest): void {
    if (!(ticket instanceof LimitTicket)) {
      this.inner.release(ticket, outcome, request);
      return;
    }
    if (ticket.plan.tokens) this.limiter.correct(ticket.plan, realTokens(ticket.cost, request) - ticket.cost, ticket.day);
    this.inner.release(ticket.inner, outcome, request);
  }

  bandName(ticket: unknown): string {
    return this.inner.bandName?.(ticket instanceof LimitTicket ? ticket.inner : ticket) ?? '';
  }

  onCapacity(model?: string): void {
    this.inner.onCapacity?.(model);
  }

  attachFleet(flows: FleetFlows): boolean {
    return this.inner.attachFleet?.(flows) ?? false;
  }

  registerMetrics(registry: Registry): void {
    this.inner.registerMetrics?.(registry);
    const l = this.limiter;
    const r = [registry];
    countLimits(registry, {
      refusals(inc) {
        inc('requests', l.refusedRequests);
        inc('tokens', l.refusedTokens);
      },
      storeErrors: () => l.shared?.errors ?? 0,
    });
    new Counter({
      name: 'switchyard_rate_limit_store_fallbacks_total',
      help: 'Requests decided without the shared counters (Redis down or slow), by the fail mode: open (admitted) or closed (503).',
      labelNames: ['mode'],
      registers: r,
      collect() {
        this.reset();
        this.inc({ mode: 'open' }, l.failedOpen);
        this.inc({ mode: 'closed' }, l.failedClosed);
      },
    });
    scrapeCounter(r, 'switchyard_rate_limit_subjects_overflowed_total', 'New keys or tenants counted under the shared (overflow) counter because rateLimits.maxSubjects subjects were busy.', () => l.overflowed);
    new Gauge({
      name: 'switchyard_rate_limit_subjects',
      help: 'Keys and tenants with rate-limit counters in this router.',
      registers: r,
      collect() {
        this.set(l.subjects);
      },
    });
  }

  close(): void | Promise<void> {
    return this.inner.close?.();
  }
}

/** What one limiter adds to the refusal and store-error metrics (the interactive gate's, the batch quotas'). */
export interface LimitCounts {
  /** Its refusals, by the `limit` label value. */
  refusals(inc: (limit: string, n: number) => void): void;
  /** Failed commands of shared counters it alone uses (0 when it shares another's). */
  storeErrors(): number;
}

const limitCounts = new WeakMap<Registry, LimitCounts[]>();

/**
 * Adds `c` to switchyard_rate_limited_total{limit} and
 * switchyard_rate_limit_store_errors_total of `registry` (made with the
 * first limiter that counts in it).
 */
export function countLimits(registry: Registry, c: LimitCounts): void {
  const known = limitCounts.get(registry);
  if (known !== undefined) {
    known.push(c);
    return;
  }
  const list: LimitCounts[] = [c];
  limitCounts.set(registry, list);
  const r = [registry];
  new Counter({
    name: 'switchyard_rate_limited_total',
    help: 'Requests answered 429 rate_limit_exceeded, by the limit that refused them (requests or tokens: a minute or a day), and batch lines a batch quota deferred (batch-quota).',
    labelNames: ['limit'],
    registers: r,
    collect() {
      this.reset();
      const inc = (limit: string, n: number) => this.inc({ limit }, n);
      for (const x of list) x.refusals(inc);
    },
  });
  scrapeCounter(r, 'switchyard_rate_limit_store_errors_total', 'Failed or timed-out commands to the shared rate-limit counters (rateLimits.redis, and the batch quotas\' on batch.redis).', () => {
    let n = 0;
    for (const x of list) n += x.storeErrors();
    return n;
  });
}

/**
 * The tokens a finished request used: the engine's usage (prompt_tokens +
 * completion_tokens) where the answer carried it, else the prompt's estimate
 * plus the output relayed (a streamed chunk is at least a token; a whole
 * answer's bytes / 4). Nothing relayed: nothing used.
 */
export function realTokens(estimate: number, r: FinishedRequest | undefined): number {
  if (r === undefined || r.responseBytes === 0) return 0;
  const prompt = r.promptTokens >= 0 ? r.promptTokens : estimate;
  const out = r.completionTokens >= 0 ? r.completionTokens : r.body.stream === true ? r.responseChunks : Math.ceil(r.responseBytes / BYTES_PER_TOKEN);
  return prompt + out;
}
