// Active-active replicas (`ha.mode: active-active`, the default with
// `ha.redis`): every router of the fleet serves, and each shares what it
// knows through one Redis stream, `<key>:fleet`:
//
// - its prefix records (what it sent where), as the standby pair's deltas
//   (deltas.ts: DeltaBuffer observes the prefix store, no allocation and no
//   Redis call per request), applied by every other replica to its own native
//   index in one call per message (PrefixStore.applyOps);
// - its load per endpoint (in flight, sent since its last scrape, prefill
//   backlog), which the others add up into Endpoint.peer* so load scores and
//   flow control's saturation see the whole fleet's dispatches.
//
// Every `ha.deltaFlushMs` a replica appends one message (XADD MAXLEN ~), its
// heartbeat too, and after a pick one within `ha.pickFlushMs` (at most one
// such message per pickFlushMs: the others see a pick within a few ms, not
// up to deltaFlushMs later); a replica whose messages stopped for
// `peerTtlMs` is gone and its share is dropped; a replica that stops
// gracefully says so in its last message and its share goes at once. No
// request waits on Redis: the append and the reader (a dedicated connection,
// XREAD BLOCK) run beside the requests; what arrives is applied and folded
// into the endpoints as it arrives (the flush timer recomputes the sums).
//
// Why a stream and not pub/sub: a stream keeps a capped backlog, so a
// replica that starts reads the recent working set to warm its index, and one
// that lost Redis for a moment resumes from the last entry it read (pub/sub
// would drop everything sent while it was away); one XADD per replica per
// flush, whatever the request rate.
//
// Redis unreachable: the append fails at once (no offline queue), logged
// once (and once when it returns) and counted; the replicas' shares expire
// after peerTtlMs, so each one routes on its own view until Redis returns,
// then the reader catches up from where it stopped.
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { HaConfig } from '../config/ha.js';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import type { PrefixStore } from '../scheduler/prefix-store.js';
import { DeltaBuffer, applyDeltaOps, decodeDelta, type DeltaMessage } from './deltas.js';
import type { FleetFlows } from '../flow/fleet-flows.js';

export interface FleetParts {
  endpoints: EndpointSet;
  /** The data layer's scrape hook (a peer's unseen requests stop counting once a scrape of ours shows them); absent: not used. */
  scrapes?: { onScrape(fn: (ep: Endpoint) => void): void };
  /** The prefix store to publish from and apply to (null: no prefix scorer, only load travels). */
  store: PrefixStore | null;
  log: Logger;
  /** Flow-control shares (ha.shareFlows with flow control on): this replica's flows go out in its messages, the others' come in; absent: not shared. */
  flows?: FleetFlows | null;
}

/** A replica's last report: its load per endpoint name, when it arrived (performance.now()). */
interface Peer {
  at: number;
  /** Per endpoint name: [in flight, unseen, prefill tokens, prefill requests]. */
  load: Map<string, [number, number, number, number]>;
}

function connection(url: string, cfg: HaConfig, role: string, onError: (err: Error) => void): Redis {
  const r = new Redis(url, {
    lazyConnect: true,
    // a command while Redis is unreachable fails at once instead of queueing behind the reconnect
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    connectTimeout: 2000,
    retryStrategy: () => Math.max(100, Math.min(cfg.peerTtlMs / 2, 1000)),
    connectionName: `switchyard-fleet-${role}`,
  });
  r.on('error', onError);
  return r;
}

export class FleetShare {
  readonly replica: string;
  readonly streamKey: string;
  readonly buffer: DeltaBuffer;
  readonly #cfg: HaConfig;
  readonly #parts: FleetParts;
  readonly #main: Redis;
  readonly #reader: Redis;
  readonly #peers = new Map<string, Peer>();
  #flush: NodeJS.Timeout | null = null;
  /** The prompt flush after a pick (ha.pickFlushMs; one Timeout, re-armed with refresh()); null: off. */
  #pick: NodeJS.Timeout | null = null;
  /** The append in progress, if any (a goodbye waits for it). */
  #flushing: Promise<void> | null = null;
  /** A flush was asked for while an append was in progress: another goes right after it. */
  #again = false;
  /** performance.now() when the last message was handed to Redis. */
  #sentAt = 0;
  #reading = false;
  #loop: Promise<void> = Promise.resolve();
  #closed = false;
  /** True while Redis answers (the last append or read succeeded). */
  #up = false;
  #everUp = false;
  lastId = '0';
  /** Messages appended, messages applied (of other replicas), ops applied, malformed messages skipped. */
  published = 0;
  applied = 0;
  ops = 0;
  malformed = 0;
  /** Failed appends and reads (Redis unreachable), times it went away. */
  redisErrors = 0;
  outages = 0;
  /** Replicas whose share expired (silent for peerTtlMs), or left (said goodbye). */
  expired = 0;
  left = 0;
  /** Wall-clock age of the newest message applied, ms (across hosts: includes clock skew). */
  lagMs = 0;

  constructor(cfg: HaConfig, parts: FleetParts) {
    this.#cfg = cfg;
    this.#parts = parts;
    this.replica = cfg.replicaId ?? `${hostname()}-${randomBytes(4).toString('hex')}`;
    this.streamKey = `${cfg.key}:fleet`;
    this.buffer = new DeltaBuffer(parts.endpoints);
    const onError = (err: Error) => this.#down(err);
    this.#main = connection(cfg.redis!, cfg, 'writer', onError);
    // the reader's XREAD BLOCK holds its connection
    this.#reader = connection(cfg.redis!, cfg, 'reader', onError);
  }

  /** Connects (bounded: Redis down does not stop the start), reads the stream's backlog into the index, and starts sharing. */
  static async start(cfg: HaConfig, parts: FleetParts): Promise<FleetShare> {
    const f = new FleetShare(cfg, parts);
    await Promise.all([f.#main.connect(), f.#reader.connect()]).then(
      () => f.#setUp(),
      (err: Error) => f.#down(err),
    );
    if (f.#up) {
      // warm up from the capped backlog: prefix records only (old load reports describe requests long gone)
      try {
        while ((await f.#read(0, false)) > 0);
      } catch (err) {
        f.#down(err as Error);
      }
    }
    parts.scrapes?.onScrape((ep) => {
      if (!f.#closed) f.#scraped(ep);
    });
    parts.store?.observe?.(f.buffer);
    f.#flush = setInterval(() => void f.flush(), cfg.deltaFlushMs);
    f.#flush.unref();
    if (cfg.pickFlushMs > 0 && cfg.pickFlushMs < cfg.deltaFlushMs) {
      // a pick's records (and the load it adds) go out within pickFlushMs, not at the next deltaFlushMs.
      // The buffer calls this on the first op after each message, never per request
      f.buffer.onFirstOp(() => f.#soon());
    }
    // a flow controller's hold, or its first queued request: its flows go out as a pick's records do
    parts.flows?.onNudge(() => f.#soon());
    f.#reading = true;
    f.#loop = f.#run();
    parts.log.info({ replica: f.replica, key: f.streamKey, shared: f.#up, applied_ops: f.ops }, 'high availability: active-active replica started');
    return f;
  }

  /**
   * A message soon: the first after a quiet spell at once (on the next turn
   * of the loop, not in the caller's), then at most one per pickFlushMs (with
   * pickFlushMs off: at the next deltaFlushMs).
   */
  #soon(): void {
    const ms = this.#cfg.pickFlushMs;
    if (this.#closed || !(ms > 0 && ms < this.#cfg.deltaFlushMs)) return;
    if (performance.now() - this.#sentAt >= ms && this.#flushing === null) setImmediate(this.#fire);
    else if (this.#pick === null) {
      this.#pick = setTimeout(this.#fire, ms);
      this.#pick.unref();
    } else this.#pick.refresh(); // re-arms the one Timeout (also after it fired)
  }

  readonly #fire = (): void => void this.flush(false, false);

  /** True while Redis answers. */
  get shared(): boolean {
    return this.#up;
  }

  /** Replicas with a live share. */
  get peers(): number {
    return this.#peers.size;
  }

  #setUp(): void {
    if (this.#up) return;
    this.#up = true;
    if (this.#everUp) this.#parts.log.info({ event: 'ha.redis_up', replica: this.replica }, 'high availability: Redis reachable again: sharing routing state with the other replicas');
    this.#everUp = true;
  }

  #down(err: Error): void {
    this.redisErrors++;
    if (!this.#up && this.outages > 0) return;
    if (this.#closed) return;
    this.#up = false;
    this.outages++;
    this.#parts.log.warn(
      { event: 'ha.redis_down', replica: this.replica, err: err.message },
      'high availability: Redis unreachable: this replica routes on its own view (the others\' shares expire) until it returns',
    );
  }

  async #run(): Promise<void> {
    while (this.#reading) {
      try {
        await this.#read(250, true);
      } catch (err) {
        if (!this.#reading) break;
        this.#down(err as Error);
        await new Promise((r) => setTimeout(r, 250).unref());
      }
    }
  }

  /** One XREAD (blocking up to `block` ms when > 0); returns the entries read. `live`: take the load reports too. */
  async #read(block: number, live: boolean): Promise<number> {
    const args: (string | number)[] = ['COUNT', 512];
    if (block > 0) args.push('BLOCK', block);
    args.push('STREAMS', this.streamKey, this.lastId);
    const res = (await this.#reader.callBuffer('XREAD', ...args)) as [Buffer, [Buffer, Buffer[]][]][] | null;
    this.#setUp();
    if (res === null) return 0;
    let n = 0;
    const now = performance.now();
    for (const [, entries] of res) {
      for (const [id, fields] of entries) {
        this.lastId = id.toString();
        n++;
        let data: Buffer | null = null;
        let from = '';
        for (let k = 0; k + 1 < fields.length; k += 2) {
          const f = fields[k].toString();
          if (f === 'd') data = fields[k + 1];
          else if (f === 'r') from = fields[k + 1].toString();
        }
        if (from === this.replica) continue; // our own
        try {
          if (data === null) throw new Error('no d field');
          const m = decodeDelta(data);
          if (typeof m.r !== 'string' || m.r === '') throw new Error('no replica id');
          this.ops += applyDeltaOps(m, this.#parts);
          this.applied++;
          if (live) this.#report(m, now);
        } catch (err) {
          this.malformed++;
          this.#parts.log.warn({ err, id: this.lastId }, 'high availability: skipped a malformed message on the shared stream');
        }
      }
    }
    return n;
  }

  #report(m: DeltaMessage, now: number): void {
    const r = m.r!;
    if (m.x === 1) {
      const gone = this.#peers.get(r);
      if (gone !== undefined) {
        this.#addShare(gone, -1);
        this.#peers.delete(r);
        this.left++;
      }
      this.#parts.flows?.dropPeer(r);
      return;
    }
    let p = this.#peers.get(r);
    if (p === undefined) {
      p = { at: now, load: new Map() };
      this.#peers.set(r, p);
      this.#parts.log.info({ event: 'ha.replica_seen', replica: r }, `high availability: replica ${r} shares its routing state`);
    }
    const num = (a: number[] | undefined, k: number) => (a !== undefined && Number.isFinite(a[k]) && a[k] > 0 ? a[k] : 0);
    // its share goes into the endpoints as it arrives (its old report out, the new one in), not at the next
    // flush: a peer's pick is counted here within pickFlushMs plus one read (the flush's full fold corrects drift)
    this.#addShare(p, -1);
    p.at = now;
    p.load.clear();
    for (let k = 0; k < m.n.length; k++) {
      const i = num(m.i, k);
      const pp = num(m.p, k);
      if (i === 0 && pp === 0) continue;
      p.load.set(m.n[k], [i, Math.min(i, num(m.u, k)), pp, num(m.q, k)]);
    }
    this.#addShare(p, 1);
    if (typeof m.t === 'number') this.lagMs = Math.max(0, Date.now() - m.t);
    // its flows last: their change pumps the flow controllers, which then see its new load too
    this.#parts.flows?.setPeer(r, m.f);
  }

  /**
   * Adds (sign 1) or takes out (-1) one peer's report from the endpoints'
   * peer counts. Its unseen requests count only while no scrape of ours left
   * after the report arrived (that scrape shows them: the rule of #fold and
   * #scraped too, so what is taken out is what was put in).
   */
  #addShare(p: Peer, sign: 1 | -1): void {
    const eps = this.#parts.endpoints;
    for (const [name, l] of p.load) {
      const ep = eps.byName(name);
      if (ep === undefined) continue;
      ep.peerInFlight = Math.max(0, ep.peerInFlight + sign * l[0]);
      if (p.at > ep.scrapeSentAt) ep.peerUnseen = Math.max(0, ep.peerUnseen + sign * l[1]);
      ep.peerPrefillPending = Math.max(0, ep.peerPrefillPending + sign * l[2]);
      ep.peerPrefillRequests = Math.max(0, ep.peerPrefillRequests + sign * l[3]);
    }
  }

  /** Drops the shares of replicas silent for peerTtlMs and writes the sum of the rest into the endpoints. */
  #fold(now: number): void {
    for (const [r, p] of this.#peers) {
      if (now - p.at > this.#cfg.peerTtlMs) {
        this.#peers.delete(r);
        this.#parts.flows?.dropPeer(r);
        this.expired++;
        this.#parts.log.info({ event: 'ha.replica_expired', replica: r, silent_ms: Math.round(now - p.at) }, `high availability: replica ${r} stopped reporting: its in-flight share expired`);
      }
    }
    for (const ep of this.#parts.endpoints.all) {
      let i = 0;
      let u = 0;
      let pp = 0;
      let q = 0;
      for (const p of this.#peers.values()) {
        const l = p.load.get(ep.name);
        if (l === undefined) continue;
        i += l[0];
        if (p.at > ep.scrapeSentAt) u += l[1];
        pp += l[2];
        q += l[3];
      }
      ep.peerInFlight = i;
      ep.peerUnseen = u;
      ep.peerPrefillPending = pp;
      ep.peerPrefillRequests = q;
    }
  }

  /** After a scrape of `ep`: the peers' unseen requests reported before it left are in its figures now. */
  #scraped(ep: Endpoint): void {
    let u = 0;
    for (const p of this.#peers.values()) {
      if (p.at <= ep.scrapeSentAt) continue;
      const l = p.load.get(ep.name);
      if (l !== undefined) u += l[1];
    }
    ep.peerUnseen = u;
  }

  /**
   * Appends this replica's message (its records, its load, its heartbeat);
   * `fold` (the deltaFlushMs timer) first recomputes the peers' sums and drops
   * the silent ones. Runs on the timers; tests call it directly.
   */
  async flush(leaving = false, fold = true): Promise<void> {
    if (fold) this.#fold(performance.now());
    if (this.#flushing !== null) {
      if (!leaving) {
        this.#again = true; // what gathers meanwhile goes right after the append in progress
        return;
      }
      await this.#flushing; // the goodbye goes after the append in progress
    }
    const msg = this.buffer.takeShare(this.replica, leaving, leaving ? undefined : this.#parts.flows?.report());
    if (!this.#up && this.#main.status !== 'ready') return; // Redis away: nothing to hand it to (the records are lost to the others)
    this.#sentAt = performance.now();
    const p = this.#append(msg);
    this.#flushing = p;
    await p;
    if (this.#flushing === p) this.#flushing = null;
    if (this.#again && !leaving && !this.#closed) {
      this.#again = false;
      if (this.buffer.pendingOps > 0) void this.flush(false, false);
    }
  }

  async #append(msg: Buffer): Promise<void> {
    try {
      await this.#main.xadd(this.streamKey, 'MAXLEN', '~', this.#cfg.streamMaxLen, '*', 'r', this.replica, 'd', msg);
      this.published++;
      this.#setUp();
    } catch (err) {
      this.#down(err as Error);
    }
  }

  registerMetrics(registry: Registry): void {
    const f = this;
    const r = [registry];
    const counter = (name: string, help: string, read: () => number) =>
      new Counter({
        name,
        help,
        registers: r,
        collect() {
          this.reset();
          this.inc(read());
        },
      });
    new Gauge({
      name: 'switchyard_ha_shared',
      help: '1 while this active-active replica shares its routing state through Redis, 0 while Redis is unreachable (it routes on its own view).',
      registers: r,
      collect() {
        this.set(f.shared ? 1 : 0);
      },
    });
    new Gauge({
      name: 'switchyard_ha_peers',
      help: 'Other router replicas whose routing state this one holds (reported within ha.peerTtlMs).',
      registers: r,
      collect() {
        this.set(f.peers);
      },
    });
    new Gauge({
      name: 'switchyard_ha_share_lag_seconds',
      help: 'Age of the newest replica message applied (their wall clock against ours: includes clock skew between hosts).',
      registers: r,
      collect() {
        this.set(f.lagMs / 1000);
      },
    });
    counter('switchyard_ha_deltas_published_total', 'Messages this router appended to the shared stream (one per ha.deltaFlushMs).', () => f.published);
    counter('switchyard_ha_deltas_applied_total', "Other replicas' messages this router applied.", () => f.applied);
    counter('switchyard_ha_ops_applied_total', "Other replicas' prefix records (picks, removals, clears) applied to this router's index.", () => f.ops);
    counter('switchyard_ha_redis_errors_total', 'Appends and reads of the shared stream that failed (Redis unreachable).', () => f.redisErrors);
    counter('switchyard_ha_redis_outages_total', 'Times Redis became unreachable for this replica.', () => f.outages);
    counter('switchyard_ha_peers_expired_total', 'Replicas whose share expired (silent for ha.peerTtlMs).', () => f.expired);
    if (this.#parts.flows) {
      const flows = this.#parts.flows;
      counter('switchyard_ha_flow_tuples_malformed_total', "Flows in other replicas' messages skipped as malformed (ha.shareFlows: a name or count of the wrong type or size, or a report over 1,024 flows).", () => flows.malformed);
    }
  }

  /** Says goodbye (the others drop this replica's share at once) and disconnects. Call after the listeners drained. */
  async close(): Promise<void> {
    if (this.#closed) return;
    if (this.#flush !== null) clearInterval(this.#flush);
    this.#flush = null;
    if (this.#pick !== null) clearTimeout(this.#pick);
    this.#pick = null;
    this.buffer.onFirstOp(null);
    this.#parts.store?.observe?.(null);
    if (this.#up) await this.flush(true).catch(() => {});
    this.#closed = true;
    this.#reading = false;
    this.#reader.disconnect();
    await this.#loop.catch(() => {});
    this.#main.disconnect();
    for (const ep of this.#parts.endpoints.all) ep.peerInFlight = ep.peerUnseen = ep.peerPrefillPending = ep.peerPrefillRequests = 0;
    this.#parts.flows?.clear();
  }
}
