// The session table's Prometheus families, read at scrape time from its plain counters.
import { Counter, Gauge } from 'prom-client';
import { scrapeCounter, type Registry } from '../metrics/prom.js';
import type { SessionTable } from './table.js';

export function registerSessionMetrics(registry: Registry, t: SessionTable): void {
  const r = [registry];
  new Gauge({
    name: 'switchyard_sessions_pinned',
    help: 'Sessions (conversations) pinned to an endpoint in this router.',
    registers: r,
    collect() {
      this.set(t.pinned);
    },
  });
  new Gauge({
    name: 'switchyard_sessions_tracked',
    help: 'Sessions this router keeps a record of (pins and turn times), up to sessions.maxSessions.',
    registers: r,
    collect() {
      this.set(t.size);
    },
  });
  const counter = (name: string, help: string, read: () => number) => scrapeCounter(r, name, help, read);
  counter('switchyard_session_turns_followed_total', 'Turns that went to the endpoint their session is pinned to.', () => t.followed);
  counter('switchyard_session_pins_created_total', 'Sessions pinned for the first time (or again after their pin expired).', () => t.newPins);
  new Counter({
    name: 'switchyard_session_moves_total',
    help: 'Turns that left their pinned endpoint, by reason: saturated (it had sessions.moveQueueDepth requests waiting), failed (unhealthy, breaker open, or it failed this request), left (no longer serves the model).',
    labelNames: ['reason'],
    registers: r,
    collect() {
      this.reset();
      this.inc({ reason: 'saturated' }, t.movedSaturated);
      this.inc({ reason: 'failed' }, t.movedFailed);
      this.inc({ reason: 'left' }, t.movedLeft);
    },
  });
  counter('switchyard_session_continuations_total', 'Requests marked as continuing an active conversation (turn priority).', () => t.continuations);
  new Counter({
    name: 'switchyard_sessions_dropped_total',
    help: 'Session records dropped, by reason: expired (sessions.ttlMs) or evicted (sessions.maxSessions).',
    labelNames: ['reason'],
    registers: r,
    collect() {
      this.reset();
      this.inc({ reason: 'expired' }, t.expired);
      this.inc({ reason: 'evicted' }, t.evicted);
    },
  });
  counter('switchyard_session_store_errors_total', 'Failed reads and writes of the shared session store (Redis).', () => t.shared?.errors ?? 0);
}
