// Keeps the router out of a busy loop at the file-descriptor limit. When every
// descriptor is taken, the listening socket stays readable but accept() fails
// with EMFILE, and the HTTP library retries at once, forever: one core burns
// and the connections already open are served late. The guard probes how full
// the descriptor table is (native lowestFreeFd(): two system calls) on a timer
// and, near the limit, stops accepting (the caller closes its listening
// socket); once connections have closed it accepts again. A reserve below the
// limit stays free for upstream connections, scrapes and health checks.

export interface AcceptGuardOptions {
  /** The soft RLIMIT_NOFILE (Infinity: no guard needed). */
  limit: number;
  /** The lowest free descriptor number, -1 when none is free (bindings' lowestFreeFd). */
  probe: () => number;
  /** Stop accepting: the caller closes its listening socket. */
  pause: (inUse: number) => void;
  /** Accept again: the caller listens again; returns false when that failed (tried again on the next tick). */
  resume: (inUse: number) => boolean;
  /** How often to probe (default 100 ms: the longest a spin can last). */
  intervalMs?: number;
}

export class AcceptGuard {
  readonly limit: number;
  /** Descriptors kept free below the limit: stop accepting at limit - reserve, accept again below limit - 2 × reserve. */
  readonly reserve: number;
  paused = false;
  /** Times accepting stopped since start. */
  pauses = 0;
  /** The last probe's figure: descriptors in use (at least; the lowest free number). */
  inUse = 0;
  readonly #o: AcceptGuardOptions;
  #timer: NodeJS.Timeout | undefined;

  constructor(o: AcceptGuardOptions) {
    this.#o = o;
    this.limit = o.limit;
    this.reserve = Math.max(32, Math.floor(o.limit * 0.05));
  }

  /** False when there is nothing to guard (no finite limit, or one too small to keep a reserve under). */
  get enabled(): boolean {
    return Number.isFinite(this.limit) && this.limit > 4 * this.reserve;
  }

  start(): void {
    if (!this.enabled || this.#timer) return;
    this.#timer = setInterval(() => this.check(), this.#o.intervalMs ?? 100);
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** One probe: pause or resume accepting as the table fills or empties. */
  check(): void {
    const low = this.#o.probe();
    if (low === -2) return; // the probe itself failed: no figure, no change
    const used = (this.inUse = low < 0 ? this.limit : low);
    if (!this.paused) {
      if (used >= this.limit - this.reserve) {
        this.paused = true;
        this.pauses++;
        // with no listening socket the HTTP library may hold nothing that keeps the process alive
        this.#timer?.ref();
        this.#o.pause(used);
      }
    } else if (used < this.limit - 2 * this.reserve) {
      if (this.#o.resume(used)) {
        this.paused = false;
        this.#timer?.unref();
      }
    }
  }
}
