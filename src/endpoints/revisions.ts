// Revisions: endpoints of one pool may run different builds (a rolling
// upgrade brings revision B up beside A). A prefill leg and its decode leg
// always stay within one revision (KV layouts may differ between builds), so
// a revision serves disaggregated traffic only while it has ready endpoints
// for every role that needs: prefill and decode (or both). This module
// answers that for the admin API and the rollout command; never per request.
import { performance } from 'node:perf_hooks';
import type { EndpointSet } from './endpoint.js';

export interface RevisionStatus {
  pool: string;
  /** '' for endpoints without a revision. */
  revision: string;
  /** Active endpoints per role, and how many of them are ready. */
  roles: Record<string, { endpoints: number; ready: number }>;
  /** Draining endpoints of this revision. */
  draining: number;
  /** Ready for aggregated traffic: some ready endpoint of role both or decode (SGLang: both only). */
  servesAggregated: boolean;
  /** Ready for disaggregated traffic: a ready prefill and a ready decode-capable endpoint (SGLang: decode only). */
  servesDisaggregated: boolean;
}

/** Per pool and revision: roles, readiness, whether it can serve aggregated and disaggregated traffic. */
export function revisionStatus(set: EndpointSet, now = performance.now()): RevisionStatus[] {
  const checks = set.dataLayer.healthIntervalMs > 0;
  const out = new Map<string, RevisionStatus>();
  const sglang = new Set<RevisionStatus>();
  for (const ep of set.all) {
    const rev = ep.revision ?? '';
    const key = `${ep.pool}\u0000${rev}`;
    let s = out.get(key);
    if (s === undefined) {
      s = { pool: ep.pool, revision: rev, roles: {}, draining: 0, servesAggregated: false, servesDisaggregated: false };
      out.set(key, s);
    }
    if (ep.engine === 'sglang') sglang.add(s);
    if (ep.state === 'draining') {
      s.draining++;
      continue;
    }
    const r = (s.roles[ep.role] ??= { endpoints: 0, ready: 0 });
    r.endpoints++;
    if (ep.ready(now, checks)) r.ready++;
  }
  for (const s of out.values()) {
    const ready = (role: string) => (s.roles[role]?.ready ?? 0) > 0;
    if (sglang.has(s)) {
      // SGLang: a decode-mode server refuses a request without a bootstrap room, a non-disaggregated
      // (both) one cannot take a prefill server's KV (docs/disaggregation.md)
      s.servesAggregated = ready('both');
      s.servesDisaggregated = ready('prefill') && ready('decode');
    } else {
      s.servesAggregated = ready('both') || ready('decode');
      s.servesDisaggregated = ready('prefill') && (ready('decode') || ready('both'));
    }
  }
  return [...out.values()];
}
