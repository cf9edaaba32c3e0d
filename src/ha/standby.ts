// A hot-standby pair: two routers with the same config and one Redis. The
// lease (lease.ts) decides which one is active; /readyz and gRPC readiness
// follow it (the router asks `leading`). The active publishes its routing
// state's deltas (deltas.ts); the standby follows them, so it takes over
// warm. Session pins and the Responses store live in Redis already and need
// nothing here.
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { HaConfig } from '../config/ha.js';
import type { EndpointSet } from '../endpoints/endpoint.js';
import type { PrefixStore } from '../scheduler/prefix-store.js';
import { HaStartError } from '../errors.js';
import { DeltaBuffer, DeltaFollower } from './deltas.js';
import { RedisLease, type Lease, type LeaseState } from './lease.js';

export interface HaParts {
  endpoints: EndpointSet;
  /** The prefix store to publish from and apply to (null: no prefix scorer, only in-flight counts travel). */
  store: PrefixStore | null;
  log: Logger;
}

function connection(url: string, cfg: HaConfig, log: Logger, role: string): Redis {
  const r = new Redis(url, {
    lazyConnect: true,
    // a command while Redis is unreachable fails at once instead of queueing behind the reconnect
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    connectTimeout: Math.min(2000, cfg.leaseTtlMs),
    retryStrategy: () => Math.min(cfg.renewIntervalMs, 1000),
    connectionName: `switchyard-ha-${role}`,
  });
  let lastLog = 0;
  r.on('error', (err: Error) => {
    const now = Date.now();
    if (now - lastLog < 10_000) return;
    lastLog = now;
    log.warn({ err: err.message, role }, 'high availability: Redis connection error (retrying)');
  });
  return r;
}

export class HighAvailability {
  readonly lease: Lease;
  readonly buffer: DeltaBuffer;
  /** The warm standby's stream follower; null without Redis (a Kubernetes lease alone: a cold standby). */
  readonly follower: DeltaFollower | null;
  readonly streamKey: string;
  readonly #cfg: HaConfig;
  readonly #parts: HaParts;
  readonly #main: Redis | null;
  readonly #reader: Redis | null;
  /** Deltas are published and followed: warmStandby and a Redis to carry them. */
  readonly #warm: boolean;
  #flush: NodeJS.Timeout | null = null;
  #flushing = false;
  #closed = false;
  published = 0;
  refused = 0;
  takeovers = 0;

  private constructor(cfg: HaConfig, parts: HaParts, k8sLease?: (redis: Redis | null) => Lease) {
    this.#cfg = cfg;
    this.#parts = parts;
    this.streamKey = `${cfg.key}:deltas`;
    this.#main = cfg.redis !== undefined ? connection(cfg.redis, cfg, parts.log, 'lease') : null;
    // the follower's XREAD BLOCK waits longer than a lease command may
    this.#reader = cfg.redis !== undefined ? connection(cfg.redis, cfg, parts.log, 'follower') : null;
    this.#warm = cfg.warmStandby && this.#reader !== null;
    this.lease = k8sLease ? k8sLease(this.#main) : new RedisLease({ redis: this.#main!, key: cfg.key, ttlMs: cfg.leaseTtlMs, renewIntervalMs: cfg.renewIntervalMs, log: parts.log });
    this.buffer = new DeltaBuffer(parts.endpoints);
    this.follower = this.#reader !== null ? new DeltaFollower(this.#reader, this.streamKey, parts, parts.log) : null;
    this.lease.onChange((s) => this.#onState(s));
  }

  /**
   * Connects, tries for the lease and starts following or publishing. Redis
   * unreachable: `onRedisDown: refuse` throws HaStartError; `serve-alone`
   * serves as active without a lease (and says so) while it keeps trying.
   */
  static async start(cfg: HaConfig, parts: HaParts): Promise<HighAvailability> {
    const log = parts.log;
    let k8sLease: ((redis: Redis | null) => Lease) | undefined;
    const k = cfg.kubernetes;
    if (k !== undefined) {
      // the lease as a Kubernetes Lease (loaded only when configured)
      const { KubeApi } = await import('../k8s/api.js');
      const { KubernetesLease } = await import('./k8s-lease.js');
      let api: import('../k8s/api.js').KubeApi;
      try {
        api = await KubeApi.load(k.kubeconfig);
      } catch (err) {
        throw new HaStartError(`high availability: ${(err as Error).message}`);
      }
      k8sLease = (redis) =>
        new KubernetesLease({ api, namespace: k.namespace ?? api.defaultNamespace, name: k.name, ttlMs: cfg.leaseTtlMs, renewIntervalMs: cfg.renewIntervalMs, log, id: k.identity, redis: redis ?? undefined, fenceKey: `${cfg.key}:fence` });
    }
    const ha = new HighAvailability(cfg, parts, k8sLease);
    const store = k !== undefined ? `the Kubernetes API server (Lease ${k.namespace ?? ''}${k.namespace ? '/' : ''}${k.name})` : `Redis at ${cfg.redis}`;
    if (k !== undefined && ha.#main !== null) {
      // Redis carries only the delta stream here: without it the standby is cold, the lease still works
      await ha.#main.connect().catch((err: Error) => log.warn({ redis: cfg.redis, err: err.message }, 'high availability: Redis unreachable at start: the delta stream waits for it (the standby may take over cold)'));
    } else if (k !== undefined && cfg.warmStandby) log.info('high availability: Kubernetes lease without ha.redis: a cold standby (no delta stream)');
    try {
      if (k === undefined) await ha.#main!.connect();
      await ha.lease.start();
    } catch (err) {
      if (cfg.onRedisDown === 'refuse') {
        await ha.close();
        throw new HaStartError(`high availability: ${store} is unreachable (${(err as Error).message}) and ha.onRedisDown is refuse`);
      }
      log.error({ store, err: (err as Error).message }, 'high availability: the lease store is unreachable at start: SERVING ALONE without a lease (ha.onRedisDown: serve-alone); retrying');
      ha.lease.serveAlone(`${store} unreachable at start`);
    }
    ha.#reader?.connect().catch(() => {
      /* retried by ioredis; the follower logs its failed reads at debug */
    });
    if (ha.lease.state === 'standby') ha.#follow('0');
    else ha.#publish();
    log.info({ state: ha.lease.state, fence: ha.lease.fence, key: cfg.key }, `high availability: started as ${ha.lease.state}`);
    return ha;
  }

  /** True while this router should take traffic (active, or alone without Redis). */
  get leading(): boolean {
    return this.lease.leading;
  }

  get state(): LeaseState {
    return this.lease.state;
  }

  #onState(s: LeaseState): void {
    if (this.#closed) return;
    if (s === 'active') {
      this.takeovers++;
      const follower = this.follower;
      if (follower !== null) void follower.stop().then(() => {
        // what the old active had in flight: load the engines carry until the next scrape says otherwise
        for (const [name, n] of follower.peerInFlight) {
          const ep = this.#parts.endpoints.byName(name);
          if (ep !== undefined && n > ep.foreign) ep.foreign = n;
        }
        follower.peerInFlight.clear();
      });
      this.#publish();
    } else if (s === 'standby') {
      this.#stopPublishing();
      const follower = this.follower;
      if (!this.#warm || follower === null) return;
      void follower.fromEnd().then(() => {
        if (!this.#closed && this.lease.state === 'standby') follower.start();
      });
    } else this.#publish(); // alone: gather deltas, publish once a lease is held
  }

  #follow(from: string): void {
    if (!this.#warm || this.follower === null) return;
    this.follower.lastId = from;
    this.follower.start();
  }

  #publish(): void {
    if (!this.#warm) return;
    this.#parts.store?.observe?.(this.buffer);
    if (this.#flush !== null) return;
    this.#flush = setInterval(() => void this.flush(), this.#cfg.deltaFlushMs);
    this.#flush.unref();
  }

  #stopPublishing(): void {
    this.#parts.store?.observe?.(null);
    if (this.#flush !== null) clearInterval(this.#flush);
    this.#flush = null;
    this.buffer.reset();
  }

  /** Publishes what gathered since the last flush (fenced). Runs on a timer; tests call it directly. */
  async flush(): Promise<void> {
    if (this.#flushing) return;
    const lease = this.lease;
    if (lease.state !== 'active') {
      if (lease.state === 'alone') this.buffer.reset(); // nobody to hand it to without a lease
      return;
    }
    const fence = lease.fence;
    const msg = this.buffer.take();
    if (msg === null) return;
    this.#flushing = true;
    try {
      const id = await lease.fencedAppend(this.streamKey, fence, this.#cfg.streamMaxLen, msg);
      if (id === null) this.refused++;
      else this.published++;
    } catch (err) {
      this.#parts.log.debug({ err }, 'high availability: publishing deltas failed');
    } finally {
      this.#flushing = false;
    }
  }

  registerMetrics(registry: Registry): void {
    const ha = this;
    const r = [registry];
    new Gauge({
      name: 'switchyard_ha_active',
      help: '1 while this router leads its standby pair (holds the lease, or serves alone without Redis), 0 as standby.',
      registers: r,
      collect() {
        this.set(ha.leading ? 1 : 0);
      },
    });
    new Gauge({
      name: 'switchyard_ha_fence',
      help: 'The fencing token of the current term (0 when not holding the lease).',
      registers: r,
      collect() {
        this.set(ha.lease.fence);
      },
    });
    new Counter({
      name: 'switchyard_ha_deltas_published_total',
      help: 'Delta messages this router appended to the stream as active.',
      registers: r,
      collect() {
        this.reset();
        this.inc(ha.published);
      },
    });
    new Counter({
      name: 'switchyard_ha_deltas_applied_total',
      help: 'Delta messages this router applied as standby.',
      registers: r,
      collect() {
        this.reset();
        this.inc(ha.follower?.messages ?? 0);
      },
    });
    new Counter({
      name: 'switchyard_ha_takeovers_total',
      help: 'Times this router became active by acquiring the lease.',
      registers: r,
      collect() {
        this.reset();
        this.inc(ha.takeovers);
      },
    });
  }

  /** Gives the lease up (the standby takes over at once) and stops following. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopPublishing();
    await this.lease.stop(true);
    const stopping = this.follower?.running ? this.follower.stop() : Promise.resolve();
    this.#reader?.disconnect();
    await stopping.catch(() => {});
    this.#main?.disconnect();
  }
}
