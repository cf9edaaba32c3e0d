// One list+watch loop over a Kubernetes collection, the way client-go's
// reflector does it (https://kubernetes.io/docs/reference/using-api/api-concepts/):
// list, then watch from the list's resourceVersion with bookmarks on; each
// event (and each BOOKMARK) moves the resourceVersion on; a watch that ends
// resumes from it; 410 Gone (the version was compacted away) relists; a
// broken stream or a failed request backs off (doubling, with jitter) and
// retries. The caller sees the whole current set after every change.
import type { Logger } from 'pino';
import type { KubeApi, KubeList, KubeObject, WatchEvent } from './api.js';

export interface ListWatchOptions {
  /** Collection path, e.g. /api/v1/namespaces/ns/pods. */
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
  watchTimeoutSeconds: number;
  backoffInitialMs: number;
  backoffMaxMs: number;
  log: Logger;
  /** Called with every object of the collection after the list and after each change. */
  onChange(items: ReadonlyMap<string, KubeObject>): void;
  /**
   * A list or watch failed and is retried in `retryInMs` (`inARow`: failures since the last success, this one
   * included); absent: each failure is logged at warn. The owner decides what is worth a line (discovery: the
   * first of a run, naming its config block and the API server).
   */
  onFailure?(err: Error, retryInMs: number, inARow: number): void;
  /** A list succeeded (or a watch delivered) after `failures` failures in a row. */
  onRecovered?(failures: number): void;
}

export interface ListWatchCounters {
  lists: number;
  /** Relists forced by 410 Gone. */
  gone: number;
  /** Watches that broke (a cut stream, a refused request, an ERROR event) and were retried after a backoff. */
  failures: number;
  /** Watch requests opened. */
  watches: number;
  events: number;
  bookmarks: number;
}

export class ListWatch {
  readonly counters: ListWatchCounters = { lists: 0, gone: 0, failures: 0, watches: 0, events: 0, bookmarks: 0 };
  readonly #api: KubeApi;
  readonly #o: ListWatchOptions;
  readonly #items = new Map<string, KubeObject>();
  readonly #abort = new AbortController();
  #rv: string | null = null;
  #backoff: number;
  #running: Promise<void> | null = null;
  #synced!: () => void;
  /** Resolves after the first successful list. */
  readonly synced: Promise<void>;
  #sleepTimer: NodeJS.Timeout | null = null;
  #wake: (() => void) | null = null;
  /** Failures since the last successful list or delivering watch. */
  #failedInARow = 0;

  constructor(api: KubeApi, opts: ListWatchOptions) {
    this.#api = api;
    this.#o = opts;
    this.#backoff = opts.backoffInitialMs;
    this.synced = new Promise((r) => (this.#synced = r));
  }

  get resourceVersion(): string | null {
    return this.#rv;
  }

  get items(): ReadonlyMap<string, KubeObject> {
    return this.#items;
  }

  start(): void {
    this.#running ??= this.#loop();
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    if (this.#sleepTimer) clearTimeout(this.#sleepTimer);
    this.#wake?.();
    await this.#running;
  }

  async #loop(): Promise<void> {
    const o = this.#o;
    const signal = this.#abort.signal;
    let goneInARow = 0;
    while (!signal.aborted) {
      try {
        if (this.#rv === null) {
          const list = await this.#api.get<KubeList>(o.path, { labelSelector: o.labelSelector, fieldSelector: o.fieldSelector });
          if (signal.aborted) return;
          if (!list || !Array.isArray(list.items) || typeof list.metadata?.resourceVersion !== 'string') throw new Error(`the list of ${o.path} has no items or resourceVersion`);
          this.counters.lists++;
          this.#items.clear();
          for (const it of list.items) if (it?.metadata?.name) this.#items.set(it.metadata.name, it);
          this.#rv = list.metadata.resourceVersion;
          this.#backoff = o.backoffInitialMs;
          this.#recovered();
          o.onChange(this.#items);
          this.#synced();
        }
        this.counters.watches++;
        const t0 = performance.now();
        const end = await this.#api.watch(
          o.path,
          { labelSelector: o.labelSelector, fieldSelector: o.fieldSelector, resourceVersion: this.#rv, allowWatchBookmarks: true, timeoutSeconds: o.watchTimeoutSeconds },
          (ev) => this.#apply(ev),
          signal,
        );
        if (signal.aborted) return;
        if (end.kind === 'gone') {
          this.counters.gone++;
          o.log.info({ path: o.path, resourceVersion: this.#rv }, 'kubernetes watch: 410 Gone (resourceVersion too old), relisting');
          this.#rv = null;
          // gone again at once after a fresh list: the server is in trouble, do not spin
          if (end.events === 0 && goneInARow++ > 0) await this.#sleep(this.#nextBackoff());
          continue;
        }
        goneInARow = 0;
        if (end.kind === 'error') throw end.error;
        if (end.events > 0) {
          this.#backoff = o.backoffInitialMs;
          this.#recovered();
        }
        // a clean end (timeoutSeconds): resume at once, unless the server keeps closing at once with nothing said
        if (end.events === 0 && performance.now() - t0 < 1000) await this.#sleep(this.#nextBackoff());
      } catch (err) {
        if (signal.aborted) return;
        this.counters.failures++;
        const delay = this.#nextBackoff();
        this.#failedInARow++;
        if (o.onFailure) o.onFailure(err as Error, delay, this.#failedInARow);
        else o.log.warn({ path: o.path, err: (err as Error).message, retryInMs: delay, resourceVersion: this.#rv }, 'kubernetes list/watch failed, retrying');
        await this.#sleep(delay);
      }
    }
  }

  #apply(ev: WatchEvent): void {
    const obj = ev.object;
    const rv = obj.metadata?.resourceVersion;
    if (ev.type === 'BOOKMARK') {
      this.counters.bookmarks++;
      if (typeof rv === 'string') this.#rv = rv;
      return;
    }
    const name = obj.metadata?.name;
    if (typeof name !== 'string') throw new Error(`watch event ${ev.type} without metadata.name`);
    if (ev.type === 'ADDED' || ev.type === 'MODIFIED') this.#items.set(name, obj);
    else if (ev.type === 'DELETED') this.#items.delete(name);
    else return; // an event type this loop does not know: ignored
    this.counters.events++;
    if (typeof rv === 'string') this.#rv = rv;
    this.#o.onChange(this.#items);
  }

  #recovered(): void {
    if (this.#failedInARow === 0) return;
    const n = this.#failedInARow;
    this.#failedInARow = 0;
    this.#o.onRecovered?.(n);
  }

  #nextBackoff(): number {
    const d = this.#backoff;
    this.#backoff = Math.min(this.#o.backoffMaxMs, this.#backoff * 2);
    // ±20 % jitter: a fleet of routers does not reconnect in step
    return Math.round(d * (0.8 + 0.4 * Math.random()));
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      this.#wake = resolve;
      this.#sleepTimer = setTimeout(resolve, ms);
    });
  }
}
