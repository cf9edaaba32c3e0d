// The router's state-change log: one line per change an operator acts on,
// never per request. Each line has an `event` field (a stable name to alert
// on) and the endpoint's name, pool and URL. Upstream failures seen by
// requests are rate-limited per endpoint (the first, then a summary of how
// many more at most every UPSTREAM_LOG_EVERY_MS). docs/observability.md lists
// the events.
import type { Logger } from 'pino';
import type { Endpoint, EndpointEvents, EndpointSet, Health } from '../endpoints/endpoint.js';
import { upstreamKind } from '../metrics/outcomes.js';

/** At most one upstream-failure line per endpoint in this long (the rest are counted into the next). */
export const UPSTREAM_LOG_EVERY_MS = 10_000;

export class StateLog implements EndpointEvents {
  readonly #log: Logger;
  /** Per endpoint id: when its last upstream-failure line went out, and the failures since. */
  readonly #lastUpstreamAt: number[] = [];
  readonly #suppressed: number[] = [];
  /** Counts each upstream failure by kind (the router's metrics); null: not counted. */
  countUpstream: ((endpointId: number, kind: number) => void) | null = null;

  constructor(log: Logger, set: EndpointSet) {
    this.#log = log;
    set.events = this;
    set.onAdded((ep) => log.info({ event: 'endpoint.added', ...where(ep), origin: ep.origin, models: ep.models, role: ep.role }, `endpoint ${ep.name} added`));
    set.onRemoved((ep) => log.info({ event: 'endpoint.removed', ...where(ep), origin: ep.origin, in_flight: ep.inFlight }, `endpoint ${ep.name} removed`));
  }

  health(ep: Endpoint, from: Health, to: Health, reason: string): void {
    if (to === 'up') this.#log.info({ event: 'endpoint.up', ...where(ep), from }, `endpoint ${ep.name} is healthy`);
    else this.#log.warn({ event: 'endpoint.down', ...where(ep), from, reason }, `endpoint ${ep.name} is unhealthy: ${reason}`);
  }

  breaker(ep: Endpoint, open: boolean): void {
    if (open) this.#log.warn({ event: 'endpoint.breaker_open', ...where(ep), failures: ep.consecutiveFailures }, `endpoint ${ep.name}: circuit breaker open after ${ep.consecutiveFailures} failures in a row`);
    else this.#log.info({ event: 'endpoint.breaker_closed', ...where(ep) }, `endpoint ${ep.name}: circuit breaker closed (its trial request succeeded)`);
  }

  draining(ep: Endpoint): void {
    this.#log.info({ event: 'endpoint.draining', ...where(ep), origin: ep.origin, in_flight: ep.inFlight }, `endpoint ${ep.name} is draining (no new requests)`);
  }

  models(ep: Endpoint, missing: readonly string[], served: readonly string[]): void {
    if (missing.length > 0) {
      this.#log.warn(
        { event: 'endpoint.model_mismatch', ...where(ep), missing, served },
        `endpoint ${ep.name} does not serve ${missing.map((m) => `"${m}"`).join(', ')} (its /v1/models lists ${served.map((m) => `"${m}"`).join(', ') || 'nothing'}): not routed there, not ready for it`,
      );
    } else this.#log.info({ event: 'endpoint.model_match', ...where(ep), served }, `endpoint ${ep.name} serves its pool's models again`);
  }

  upstreamFailed(ep: Endpoint, message: string, midStream: boolean): void {
    this.countUpstream?.(ep.id, upstreamKind(message, midStream));
    const now = Date.now();
    const last = this.#lastUpstreamAt[ep.id] ?? 0;
    if (now - last < UPSTREAM_LOG_EVERY_MS) {
      this.#suppressed[ep.id] = (this.#suppressed[ep.id] ?? 0) + 1;
      return;
    }
    const more = this.#suppressed[ep.id] ?? 0;
    this.#lastUpstreamAt[ep.id] = now;
    this.#suppressed[ep.id] = 0;
    this.#log.warn(
      { event: 'endpoint.upstream_error', ...where(ep), error: message, mid_stream: midStream, ...(more > 0 ? { more_since_last_line: more } : {}) },
      `endpoint ${ep.name}: request failed ${midStream ? 'mid-stream' : 'before its first byte'}: ${message}`,
    );
  }

  /** A precise pool's KV-event publisher cannot be reached (once per outage; `where` the config field of its address). */
  kvStreamUnreachable(name: string, endpoint: string, where: string, reason: string): void {
    this.#log.warn(
      { event: 'kv_events.unreachable', endpoint: name, zmq: endpoint, block: where, reason },
      `KV-event stream of ${name} (${where || 'kvEvents.endpoint'}): the publisher at ${endpoint} cannot be reached: ${reason}; precise scoring uses the approximate mode for ${name} until it connects (logged then)`,
    );
  }

  /** A precise pool's KV-event stream connected or lost its publisher. */
  kvStream(name: string, endpoint: string, connected: boolean): void {
    if (connected) this.#log.info({ event: 'kv_events.connected', endpoint: name, zmq: endpoint }, `KV-event stream of ${name} connected`);
    else this.#log.warn({ event: 'kv_events.disconnected', endpoint: name, zmq: endpoint }, `KV-event stream of ${name} disconnected: precise scoring falls back to approximate for it`);
  }
}

function where(ep: Endpoint): { endpoint: string; pool: string; url: string } {
  return { endpoint: ep.name, pool: ep.pool, url: ep.url };
}
