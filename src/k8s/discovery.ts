// Kubernetes discovery: a pool's endpoints from its pods. An EndpointSource
// (src/endpoints/live.ts) like the config file and the admin API: it knows
// the whole desired set (the ready pods), so every change is one
// `reconcile(origin, [pool])`, which adds new endpoints and drains (then
// removes) those gone or changed. A pod that goes unready or starts
// terminating is drained, never cut: its in-flight requests finish.
//
// With an InferencePool (inference.networking.k8s.io/v1), the pool object is
// watched too: spec.selector.matchLabels picks the pods, spec.targetPorts
// their ports (one endpoint per pod and port). A selector change restarts the
// pod watch with the new selector; the endpoints of the old one stay until
// the new list replaces them.
import type { Logger } from 'pino';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { PoolConfig, EndpointConfig, Role } from '../config/schema.js';
import { ROLES } from '../config/schema.js';
import type { KubernetesDiscoveryConfig } from '../config/discovery.js';
import type { EndpointSource, EndpointTarget } from '../endpoints/live.js';
import { KubeApi, type KubeObject } from './api.js';
import { ListWatch } from './list-watch.js';

export const INFERENCE_POOL_API = '/apis/inference.networking.k8s.io/v1';

interface PodLike extends KubeObject {
  status?: { phase?: string; podIP?: string; conditions?: { type?: string; status?: string }[] };
}

/** What an InferencePool says about its pods. */
interface PoolView {
  selector: string;
  ports: number[];
}

export interface DiscoveryStats {
  /** Ready pods × ports currently endpoints of this source. */
  endpoints: number;
  /** Pods seen that are not (yet) ready or are terminating. */
  notReady: number;
  /** Pods skipped for a bad role label or port. */
  skipped: number;
  /** Times the pod watch was restarted for a changed InferencePool selector or ports. */
  reselects: number;
  /** Pod sets that could not be applied (the endpoint ids used up). */
  failedReconciles: number;
  lists: number;
  gone: number;
  failures: number;
  bookmarks: number;
}

export class KubernetesDiscovery implements EndpointSource {
  readonly name: string;
  readonly pool: PoolConfig;
  readonly cfg: KubernetesDiscoveryConfig;
  readonly #log: Logger;
  #api: KubeApi | null = null;
  #ns = '';
  #target: EndpointTarget | null = null;
  #pods: ListWatch | null = null;
  #poolWatch: ListWatch | null = null;
  #view: PoolView | null = null;
  #closed = false;
  #pending = false;
  /** Pods already warned about (a bad label is logged once per pod version). */
  readonly #warned = new Set<string>();
  readonly stats: DiscoveryStats = { endpoints: 0, notReady: 0, skipped: 0, reselects: 0, failedReconciles: 0, lists: 0, gone: 0, failures: 0, bookmarks: 0 };
  /** Counters of list/watch loops that were stopped (a reselect), kept in the totals. */
  readonly #past = { lists: 0, gone: 0, failures: 0, bookmarks: 0 };
  /** The config block, as a field path (pools[i].discovery.kubernetes), named by every line about reaching the API. */
  readonly where: string;
  /** The API server cannot be reached (its first failure was logged; the next lines are debug until it answers). */
  #unreachable = false;

  /** `poolIndex`: the pool's place in config.pools (for the field path in messages). */
  constructor(pool: PoolConfig, log: Logger, poolIndex = 0) {
    if (pool.discovery === undefined) throw new TypeError(`pool "${pool.name}" has no discovery block`);
    this.pool = pool;
    this.where = `pools[${poolIndex}].discovery.kubernetes`;
    this.cfg = pool.discovery.kubernetes;
    this.name = `kubernetes:${pool.name}`;
    this.#log = log.child({ source: this.name });
  }

  get namespace(): string {
    return this.#ns;
  }

  /**
   * Loads the kubeconfig (rejects when there is none: a config error the
   * operator must see), starts the watches, and waits for the first pod list
   * up to initialSyncTimeoutMs; an API server that cannot be reached is
   * retried in the background (the pool has no endpoints meanwhile).
   */
  async start(target: EndpointTarget): Promise<void> {
    this.#target = target;
    try {
      this.#api = await KubeApi.load(this.cfg.kubeconfig);
    } catch (err) {
      // no cluster to ask: the start stops (exit 1), naming the block
      throw new Error(`${this.where} (pool "${this.pool.name}"): ${(err as Error).message}`);
    }
    this.#ns = this.cfg.namespace ?? this.#api.defaultNamespace;
    const api = this.#api;
    const common = this.#common();
    let first: Promise<void>;
    if (this.cfg.inferencePool !== undefined) {
      const name = this.cfg.inferencePool;
      let resolveFirst!: () => void;
      first = new Promise((r) => (resolveFirst = r));
      this.#poolWatch = new ListWatch(api, {
        ...common,
        path: `${INFERENCE_POOL_API}/namespaces/${this.#ns}/inferencepools`,
        fieldSelector: `metadata.name=${name}`,
        onChange: (items) => {
          this.#onPool(items.get(name));
          if (this.#pods) void this.#pods.synced.then(resolveFirst);
          else resolveFirst(); // no pool object (or an unusable one): nothing to wait for
        },
      });
      this.#poolWatch.start();
    } else {
      this.#startPods(this.cfg.labelSelector!);
      first = this.#pods!.synced;
    }
    const wait = this.cfg.initialSyncTimeoutMs;
    let timer: NodeJS.Timeout | undefined;
    const synced = await Promise.race([first.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), wait)))]);
    clearTimeout(timer);
    // an API server that failed has said so in its one line; one that has not answered at all says it here
    if (!synced && !this.#unreachable) {
      this.#unreachable = true; // this is the outage's line: a failure that follows logs at debug, the answer at info
      this.#log.warn(
        { event: 'kubernetes.unreachable', block: this.where, server: this.#api.server.origin, namespace: this.#ns, waitedMs: wait },
        `kubernetes discovery (${this.where}): no pod list from the API server at ${this.#api.server.origin} within ${wait} ms: serving pool "${this.pool.name}" without its discovered endpoints while it keeps trying`,
      );
    }
  }

  /** What both list/watch loops share: the timings, and one line per outage of the API server. */
  #common() {
    return {
      watchTimeoutSeconds: this.cfg.watchTimeoutSeconds,
      backoffInitialMs: this.cfg.backoffInitialMs,
      backoffMaxMs: this.cfg.backoffMaxMs,
      log: this.#log,
      onFailure: (err: Error, retryInMs: number, inARow: number) => this.#failed(err, retryInMs, inARow),
      onRecovered: (failures: number) => {
        if (!this.#unreachable) return;
        this.#unreachable = false;
        this.#log.info({ event: 'kubernetes.reachable', block: this.where, server: this.#api?.server.origin, failures }, `kubernetes discovery (${this.where}): the API server answers again (after ${failures} failed attempts)`);
      },
    };
  }

  #failed(err: Error, retryInMs: number, inARow: number): void {
    const server = this.#api?.server.origin ?? '';
    if (this.#unreachable || inARow > 1) {
      this.#log.debug({ block: this.where, server, err: err.message, retryInMs, inARow }, 'kubernetes list/watch failed again, retrying');
      return;
    }
    this.#unreachable = true;
    this.#log.warn(
      { event: 'kubernetes.unreachable', block: this.where, server, namespace: this.#ns, err: err.message, retryInMs, backoffMaxMs: this.cfg.backoffMaxMs },
      `kubernetes discovery (${this.where}): the API server at ${server} failed: ${err.message}; retrying with backoff (${this.cfg.backoffInitialMs} ms doubling to ${this.cfg.backoffMaxMs} ms), ${this.snapshot().lists > 0 ? `pool "${this.pool.name}" keeps the endpoints last listed` : `pool "${this.pool.name}" served without its discovered endpoints`} meanwhile (logged again when it answers)`,
    );
  }

  async close(): Promise<void> {
    this.#closed = true;
    await Promise.all([this.#poolWatch?.stop(), this.#pods?.stop()]);
  }

  /** Totals over the current and past list/watch loops. */
  snapshot(): DiscoveryStats {
    const s = { ...this.stats };
    for (const k of ['lists', 'gone', 'failures', 'bookmarks'] as const) {
      s[k] = this.#past[k] + (this.#pods?.counters[k] ?? 0) + (this.#poolWatch?.counters[k] ?? 0);
    }
    return s;
  }

  #onPool(obj: KubeObject | undefined): void {
    if (this.#closed) return;
    const name = this.cfg.inferencePool!;
    if (obj === undefined) {
      this.#log.warn({ namespace: this.#ns, inferencePool: name }, 'kubernetes discovery: the InferencePool does not exist (or was deleted): its endpoints drain');
      this.#view = null;
      void this.#stopPods();
      this.#reconcile();
      return;
    }
    const view = poolView(obj);
    if (typeof view === 'string') {
      this.#log.error({ namespace: this.#ns, inferencePool: name, problem: view }, 'kubernetes discovery: unusable InferencePool, keeping the current endpoints');
      return;
    }
    const prev = this.#view;
    this.#view = view;
    if (prev !== null && prev.selector === view.selector && prev.ports.join() === view.ports.join() && this.#pods) return;
    if (prev !== null && prev.selector !== view.selector) {
      this.stats.reselects++;
      this.#log.info({ inferencePool: name, from: prev.selector, to: view.selector }, 'kubernetes discovery: the InferencePool selector changed, re-selecting pods');
    }
    if (prev === null || prev.selector !== view.selector || !this.#pods) {
      // the old watch's endpoints stay until the new list reconciles them away
      const old = this.#pods;
      this.#pods = null;
      if (old) void this.#retire(old);
      this.#startPods(view.selector);
    } else this.#reconcile(); // ports changed only
  }

  #startPods(selector: string): void {
    this.#pods = new ListWatch(this.#api!, {
      ...this.#common(),
      path: `/api/v1/namespaces/${this.#ns}/pods`,
      labelSelector: selector,
      onChange: () => this.#reconcile(),
    });
    this.#pods.start();
  }

  async #retire(lw: ListWatch): Promise<void> {
    await lw.stop();
    for (const k of ['lists', 'gone', 'failures', 'bookmarks'] as const) this.#past[k] += lw.counters[k];
  }

  async #stopPods(): Promise<void> {
    const old = this.#pods;
    this.#pods = null;
    if (old) await this.#retire(old);
  }

  /** Coalesces a burst of events (a relist, a rollout) into one reconcile. */
  #reconcile(): void {
    if (this.#pending || this.#closed) return;
    this.#pending = true;
    queueMicrotask(() => {
      this.#pending = false;
      if (this.#closed || this.#target === null) return;
      const endpoints = this.#desired();
      try {
        const r = this.#target.reconcile(this.name, [{ ...this.pool, endpoints }]);
        this.stats.endpoints = endpoints.length;
        if (r.added.length + r.removed.length + r.replaced.length > 0) this.#log.info({ ...r }, 'kubernetes discovery: endpoints changed');
      } catch (err) {
        // e.g. the router's endpoint ids are used up (SWY_ERR_ENDPOINT_IDS): logged, the next change retries
        this.stats.failedReconciles++;
        this.#log.error({ err: (err as Error).message, code: (err as { code?: string }).code }, 'kubernetes discovery: could not apply the pod set');
      }
    });
  }

  /** Ready pods → endpoint configs. */
  #desired(): EndpointConfig[] {
    const out: EndpointConfig[] = [];
    const pods = this.#pods;
    let notReady = 0;
    let skipped = 0;
    if (pods === null || (this.cfg.inferencePool !== undefined && this.#view === null)) {
      this.stats.notReady = 0;
      return out;
    }
    for (const pod of pods.items.values() as Iterable<PodLike>) {
      const name = pod.metadata.name;
      if (!podReady(pod)) {
        notReady++;
        continue;
      }
      const labels = pod.metadata.labels ?? {};
      const roleValue = labels[this.cfg.roleLabel];
      const role = toRole(roleValue);
      const warnKey = `${name}@${pod.metadata.resourceVersion ?? ''}`;
      if (role === null) {
        skipped++;
        if (!this.#warned.has(warnKey)) {
          this.#warned.add(warnKey);
          this.#log.warn({ pod: name, label: this.cfg.roleLabel, value: roleValue }, `kubernetes discovery: pod skipped, its role label must be one of ${ROLES.join(', ')}`);
        }
        continue;
      }
      const ann = pod.metadata.annotations?.[this.cfg.portAnnotation];
      let ports: number[];
      if (ann !== undefined) {
        const p = Number(ann);
        if (!Number.isInteger(p) || p < 1 || p > 65535) {
          skipped++;
          if (!this.#warned.has(warnKey)) {
            this.#warned.add(warnKey);
            this.#log.warn({ pod: name, annotation: this.cfg.portAnnotation, value: ann }, 'kubernetes discovery: pod skipped, its port annotation is not a port number');
          }
          continue;
        }
        ports = [p];
      } else if (this.cfg.targetPort !== undefined) ports = [this.cfg.targetPort];
      else ports = this.#view?.ports ?? [];
      const ip = pod.status!.podIP!;
      const host = ip.includes(':') ? `[${ip}]` : ip;
      const revision = this.cfg.revisionLabel !== undefined ? labels[this.cfg.revisionLabel] : undefined;
      for (const port of ports) {
        out.push({
          name: ports.length > 1 ? `${name}:${port}` : name,
          url: `http://${host}:${port}`,
          role,
          ...(revision ? { revision } : {}),
        });
      }
    }
    this.stats.notReady = notReady;
    this.stats.skipped = skipped;
    if (this.#warned.size > 10_000) this.#warned.clear();
    return out;
  }
}

/** Running, with an IP, Ready=True, and not terminating. */
export function podReady(pod: PodLike): boolean {
  if (pod.metadata.deletionTimestamp) return false;
  const s = pod.status;
  if (!s || s.phase !== 'Running' || typeof s.podIP !== 'string' || s.podIP === '') return false;
  return Array.isArray(s.conditions) && s.conditions.some((c) => c?.type === 'Ready' && c.status === 'True');
}

function toRole(v: string | undefined): Role | null {
  if (v === undefined || v === '') return 'both';
  if (v === 'prefill-decode') return 'both'; // spelled so in some llm-d deployments
  return (ROLES as readonly string[]).includes(v) ? (v as Role) : null;
}

/**
 * An InferencePool's selector (as a selector string) and ports, or what is
 * wrong with it. v1: spec.selector.matchLabels and spec.targetPorts[].number;
 * the v1alpha2 shape (spec.selector a plain map, spec.targetPortNumber) is read too.
 */
export function poolView(obj: KubeObject): PoolView | string {
  const spec = obj.spec as { selector?: unknown; targetPorts?: unknown; targetPortNumber?: unknown } | undefined;
  if (!spec || typeof spec !== 'object') return 'no spec';
  const sel = spec.selector as Record<string, unknown> | undefined;
  if (!sel || typeof sel !== 'object') return 'no spec.selector';
  const labels = (sel.matchLabels !== undefined ? sel.matchLabels : sel) as Record<string, unknown>;
  if (!labels || typeof labels !== 'object') return 'spec.selector.matchLabels is not a mapping';
  const pairs = Object.entries(labels).filter(([, v]) => typeof v === 'string');
  if (pairs.length === 0) return 'an empty selector (it would pick every pod of the namespace)';
  const selector = pairs
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([k, v]) => `${k}=${String(v)}`)
    .join(',');
  let ports: number[] = [];
  if (Array.isArray(spec.targetPorts)) ports = spec.targetPorts.map((p: { number?: unknown }) => Number(p?.number));
  else if (spec.targetPortNumber !== undefined) ports = [Number(spec.targetPortNumber)];
  if (ports.some((p) => !Number.isInteger(p) || p < 1 || p > 65535)) return `spec.targetPorts has a bad port number (${JSON.stringify(spec.targetPorts ?? spec.targetPortNumber)})`;
  return { selector, ports };
}

/** The discovery sources' state on the router's /metrics (read at scrape time). */
export function registerDiscoveryMetrics(registry: Registry, sources: readonly KubernetesDiscovery[]): void {
  if (sources.length === 0) return;
  const r = [registry];
  const gauge = (name: string, help: string, read: (s: DiscoveryStats) => number) =>
    new Gauge({
      name,
      help,
      labelNames: ['source'],
      registers: r,
      collect() {
        for (const src of sources) this.set({ source: src.name }, read(src.snapshot()));
      },
    });
  const counter = (name: string, help: string, read: (s: DiscoveryStats) => number) =>
    new Counter({
      name,
      help,
      labelNames: ['source'],
      registers: r,
      collect() {
        this.reset();
        for (const src of sources) this.inc({ source: src.name }, read(src.snapshot()));
      },
    });
  gauge('switchyard_discovery_endpoints', 'Endpoints a discovery source currently provides (ready pods × ports).', (s) => s.endpoints);
  gauge('switchyard_discovery_pods_not_ready', 'Selected pods that are not ready or are terminating.', (s) => s.notReady);
  gauge('switchyard_discovery_pods_skipped', 'Selected ready pods skipped for a bad role label or port annotation.', (s) => s.skipped);
  counter('switchyard_discovery_lists_total', 'Full lists (the first, and each relist).', (s) => s.lists);
  counter('switchyard_discovery_gone_total', 'Relists forced by 410 Gone (resourceVersion compacted away).', (s) => s.gone);
  counter('switchyard_discovery_watch_failures_total', 'Lists or watches that failed or broke and were retried after a backoff.', (s) => s.failures);
  counter('switchyard_discovery_reselects_total', "Pod watches restarted for a changed InferencePool selector.", (s) => s.reselects);
}
