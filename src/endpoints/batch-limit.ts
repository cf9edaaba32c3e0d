// An engine's batch limit (vLLM --max-num-seqs, SGLang --max-running-requests)
// learned from its own metrics, so flow control knows how many requests an
// endpoint runs at once without the operator typing it. Engines do not export
// the limit; they export running and waiting counts, and those show it: once
// the batch is full, running stops rising while requests wait. So the running
// count seen at two scrapes in a row with requests waiting, and no lower than
// the largest running count ever seen, is the limit. One scrape is not enough:
// a request that arrived just before the scrape waits for the engine's next
// step even when the batch has room, and learning from that would pin the
// limit low for good (the router would never send more to prove otherwise).
//
// Until it is learned the limit is a probe: DEFAULT_BATCH_LIMIT, doubled each
// time a scrape shows the engine running at least 3/4 of it with nothing
// waiting (the engine took all it was given: it may take more), so a large
// engine is opened up in a few scrapes under load and a small one is found out
// the first time it queues.

/** Batch limit assumed for an engine until its own one is learned. */
export const DEFAULT_BATCH_LIMIT = 8;
/** The probe never grows past this. */
export const MAX_BATCH_LIMIT = 65_536;

export class BatchLimit {
  /** The learned limit; 0 until learned. */
  learned = 0;

  /** `configured`: the operator's figure (pools[].batchLimit), taken as learned from the start; the engine's own counts still correct it. */
  constructor(configured = 0) {
    if (configured > 0) this.learned = configured;
  }

  /** The limit used until one is learned. */
  probe = DEFAULT_BATCH_LIMIT;
  /** The largest running count any scrape showed (the limit is at least this). */
  maxRunning = 0;
  /** Running count of the previous scrape when requests were waiting then, else -1. */
  #plateau = -1;

  /** The engine's batch limit as far as it is known: the learned one, else the probe. */
  get value(): number {
    return this.learned > 0 ? this.learned : this.probe;
  }

  /** Feeds one successful scrape's figures. */
  observe(running: number, waiting: number): void {
    if (!(running >= 0) || !(waiting >= 0)) return; // NaN or negative: nothing learnt
    if (running > this.maxRunning) this.maxRunning = running;
    if (this.learned > 0 && running > this.learned) this.learned = running; // it ran more than we thought
    if (waiting > 0 && running > 0) {
      if (running === this.#plateau && running >= this.maxRunning) this.learned = running;
      this.#plateau = running;
      return;
    }
    this.#plateau = -1;
    if (this.learned === 0 && waiting === 0) {
      while (running * 4 >= this.probe * 3 && this.probe < MAX_BATCH_LIMIT) this.probe *= 2;
    }
  }
}
