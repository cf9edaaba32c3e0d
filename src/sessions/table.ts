// The session table: per conversation, the endpoint it is pinned to and when
// its last turn ended. Bounded (least recently used dropped first) and
// expiring (a session's record lives `ttlMs` after its last use). The
// scheduler's `session-affinity` filter reads and moves pins during the
// (synchronous) pick; the director asks whether a request continues an active
// conversation before admission and records each turn's end. With a
// SharedSessions (Redis) attached, the table is that store's local cache: the
// director reads a session through before admission, and pin changes and turn
// ends are written through after the fact (never awaited on the request path).
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import { defaultSessions, type SessionsConfig } from '../config/sessions.js';

export class SessionEntry {
  readonly key: string;
  /** The endpoint the conversation is pinned to; null: not pinned (yet, or the pin was dropped). */
  ep: Endpoint | null = null;
  /** Date.now() when the previous turn ended; 0: none yet. */
  lastEnd = 0;
  /** Date.now() of the last use (expiry counts from here). */
  touched = 0;
  /** Date.now() when the shared store was last read for it; 0: never. */
  syncedAt = 0;
  constructor(key: string) {
    this.key = key;
  }
}

/** Why a turn did not go to its pinned endpoint. */
export const MOVE_SATURATED = 1;
/** The pinned endpoint was filtered out (unhealthy, breaker open, tried and failed). */
export const MOVE_FAILED = 2;
/** The pinned endpoint is not a candidate for the model any more (it left, or the session changed model). */
export const MOVE_LEFT = 3;

/** What several routers share (Redis): a read before admission, writes after the fact. */
export interface SharedSessions {
  /** Reads `e`'s session and hands what it found to `apply` (last turn end, endpoint name); resolves either way (a failure keeps the local view). */
  load(e: SessionEntry, apply: (e: SessionEntry, lastEnd: number, endpoint: string) => void): Promise<void>;
  /** Writes `e`'s pin and last turn end (fire and forget). */
  save(e: SessionEntry): void;
  /** Resolves once connected (or when it gave up trying for now). */
  ready(): Promise<void>;
  close(): Promise<void>;
  /** Failed reads and writes since start. */
  readonly errors: number;
}

export class SessionTable {
  readonly config: SessionsConfig;
  readonly endpoints: EndpointSet;
  /** Insertion order is recency order: a use moves the entry to the end. */
  readonly #map = new Map<string, SessionEntry>();
  shared: SharedSessions | null = null;
  #sweep: NodeJS.Timeout | null = null;

  // counters (read at scrape time)
  /** Sessions currently pinned to an endpoint. */
  pinned = 0;
  /** Turns that went to their pinned endpoint. */
  followed = 0;
  /** First pins. */
  newPins = 0;
  movedSaturated = 0;
  movedFailed = 0;
  movedLeft = 0;
  /** Requests marked as continuing an active conversation. */
  continuations = 0;
  /** Sessions dropped by the size bound / by expiry. */
  evicted = 0;
  expired = 0;

  constructor(endpoints: EndpointSet, config: SessionsConfig = defaultSessions()) {
    this.endpoints = endpoints;
    this.config = config;
  }

  get size(): number {
    return this.#map.size;
  }

  /** Starts the expiry sweep (the router does; a bare table expires lazily on lookup). */
  start(): void {
    if (this.#sweep !== null) return;
    const every = Math.max(250, Math.min(30_000, Math.floor(this.config.ttlMs / 4)));
    this.#sweep = setInterval(() => this.sweep(Date.now()), every);
    this.#sweep.unref();
  }

  /** Drops expired sessions (the oldest uses come first in the map). */
  sweep(now: number): void {
    const ttl = this.config.ttlMs;
    for (const e of this.#map.values()) {
      if (now - e.touched <= ttl) break;
      this.#remove(e);
      this.expired++;
    }
  }

  /** The live entry for `key`, or undefined (no use is recorded). */
  peek(key: string, now: number): SessionEntry | undefined {
    const e = this.#map.get(key);
    if (e === undefined) return undefined;
    if (now - e.touched > this.config.ttlMs) {
      this.#remove(e);
      this.expired++;
      return undefined;
    }
    return e;
  }

  /** The entry for `key`, made when absent, marked as used now. */
  use(key: string, now: number): SessionEntry {
    const map = this.#map;
    let e = this.peek(key, now);
    if (e === undefined) {
      e = new SessionEntry(key);
      if (map.size >= this.config.maxSessions) {
        const oldest = map.values().next().value as SessionEntry;
        this.#remove(oldest);
        this.evicted++;
      }
    } else map.delete(key);
    map.set(key, e);
    e.touched = now;
    return e;
  }

  #remove(e: SessionEntry): void {
    if (this.#map.get(e.key) === e) this.#map.delete(e.key);
    if (e.ep !== null) {
      this.#pinsOn[e.ep.id]!--;
      e.ep = null;
      this.pinned--;
    }
  }

  /** Sessions pinned to each endpoint, by endpoint id. */
  readonly #pinsOn: number[] = [];

  /** Sessions pinned to `ep` now. */
  pinsOn(ep: Endpoint): number {
    return this.#pinsOn[ep.id] ?? 0;
  }

  /** Sets (or drops, with null) `e`'s pin, keeping the pinned counts. */
  setPin(e: SessionEntry, ep: Endpoint | null): void {
    if (e.ep === ep) return;
    if (e.ep === null) this.pinned++;
    else {
      this.#pinsOn[e.ep.id]!--;
      if (ep === null) this.pinned--;
    }
    if (ep !== null) this.#pinsOn[ep.id] = (this.#pinsOn[ep.id] ?? 0) + 1;
    e.ep = ep;
  }

  /**
   * The pick chose `ep` for session `key` (the filter's verdict: 0 followed or
   * new, else a MOVE_* reason): the pin follows the turn.
   */
  picked(key: string, ep: Endpoint, move: number): void {
    const e = this.use(key, Date.now());
    const prev = e.ep;
    if (prev === ep) {
      this.followed++;
      return;
    }
    if (prev === null) this.newPins++;
    else if (move === MOVE_SATURATED) this.movedSaturated++;
    else if (move === MOVE_LEFT) this.movedLeft++;
    else this.movedFailed++;
    this.setPin(e, ep);
    this.shared?.save(e);
  }

  /** True (and counted) when `key`'s previous turn ended within the continuation window. */
  continues(key: string, now: number): boolean {
    const w = this.config.continuationWindowMs;
    if (w === 0) return false;
    const e = this.peek(key, now);
    if (e === undefined || e.lastEnd === 0 || now - e.lastEnd > w) return false;
    this.continuations++;
    return true;
  }

  /** A turn of `key` ended (any outcome): the turn tracker's record, written through to the shared store. */
  turnEnded(key: string, now: number): void {
    const e = this.use(key, now);
    e.lastEnd = now;
    this.shared?.save(e);
  }

  /**
   * Before admission, with a shared store: reads `key` through (its pin and
   * last turn may have been written by another router). Null when there is
   * nothing to wait for (no shared store).
   */
  load(key: string, now: number): Promise<void> | null {
    const shared = this.shared;
    if (shared === null) return null;
    const e = this.use(key, now);
    return shared.load(e, this.#apply);
  }

  /** What the shared store holds for a session: the later turn end wins; its pin replaces ours (another router may have moved it). */
  readonly #apply = (e: SessionEntry, lastEnd: number, endpoint: string): void => {
    if (lastEnd > e.lastEnd) e.lastEnd = lastEnd;
    if (endpoint === '') return;
    // an endpoint this router does not know (another router's config) is no pin here
    const ep = this.endpoints.byName(endpoint);
    if (ep !== undefined && this.#map.get(e.key) === e) this.setPin(e, ep);
  };

  async close(): Promise<void> {
    if (this.#sweep !== null) clearInterval(this.#sweep);
    this.#sweep = null;
    await this.shared?.close();
  }
}
