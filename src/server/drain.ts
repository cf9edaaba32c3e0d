// The requests in flight, and what a drain does with those still running when
// its grace ends: a stream gets an SSE error event (OpenAI's error shape) and
// its end, an answer not yet begun a 503, and each is logged and counted.
import { errorBody } from '../proxy/error-shape.js';
import { SlotList } from './reading-list.js';
import type { ExchangeFlight } from './exchange-flight.js';
import type { Caller } from '../identity.js';

/** What the drain needs of a request in flight (HttpExchange). */
export interface Cuttable {
  /** Position in the active list; -1 when not in it. */
  activeSlot: number;
  readonly requestId: string;
  /** Ends the request now: an SSE error event for a stream whose head went out, else a 503. */
  cutForShutdown(sseEvent: string, message: string): void;
}

/** What the router keeps of a request in flight, on either front end (HttpExchange, NativeExchange): the drain's cut, the outcome metrics, the access log. */
export interface InFlightRequest extends Cuttable {
  readonly flight: ExchangeFlight | null;
  /** How it ended (src/metrics/outcomes.ts), and a rejection's reason. */
  readonly outcome: number;
  readonly rejectReason: string;
  /** performance.now() when its headers arrived, and when its answer's first bytes went out (0: none). */
  readonly startedAt: number;
  readonly firstByteAt: number;
  readonly tenant: string;
  /** Who sent it (src/identity.ts): the usage counters' tenant and key. */
  readonly caller: Caller;
  /** Its route. */
  readonly path: string;
}

/** The `code` of the error a drain's cut request gets. */
export const SHUTDOWN_CODE = 'router_shutting_down';

export function shutdownMessage(graceMs: number): string {
  return graceMs > 0 ? `the router is shutting down: the request did not finish within the ${graceMs} ms drain grace` : 'the router is shutting down now';
}

/** The SSE error event (and [DONE]) a stream cut by a drain ends with. */
export function shutdownEvent(message: string): string {
  return `data: ${errorBody(503, message, null, SHUTDOWN_CODE)}\n\ndata: [DONE]\n\n`;
}

/** The requests in flight (swap-remove through each request's `activeSlot`; no allocation per request). */
export class ActiveList<T extends Cuttable = InFlightRequest> extends SlotList<'activeSlot', T> {
  constructor() {
    super('activeSlot');
  }

  /** Cuts every request still in flight; returns the ids of those cut (at most `maxIds` of them) and their count. */
  cutAll(graceMs: number, maxIds = 50): { count: number; ids: string[] } {
    const message = shutdownMessage(graceMs);
    const event = shutdownEvent(message);
    const all = [...this.items]; // each cut removes itself
    const ids: string[] = [];
    for (const r of all) {
      if (ids.length < maxIds) ids.push(r.requestId);
      r.cutForShutdown(event, message);
    }
    return { count: all.length, ids };
  }
}
