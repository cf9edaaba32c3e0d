// The router's services in their close order: one list replaces the hand-written shutdown sequences.

/** A started service the lifecycle closes. graceMs: how long in-flight work may finish (0 on a failed start). */
export type CloseFn = (graceMs?: number) => Promise<void> | void;

/**
 * Close ranks: lower closes first; services of the same rank close together.
 * The lease goes first (the standby takes over while this one drains), then
 * everything that changes state (config watcher, admin API, endpoint discovery),
 * then batch work, then the listeners that drain client requests, and last
 * the components they served with (director, scheduler, upstream client, ...).
 */
export const CloseRank = {
  watcher: 1,
  lease: 2,
  admin: 3,
  discovery: 4,
  batchApi: 5,
  batch: 6,
  serving: 7,
  /** Active-active sharing (src/ha/fleet.ts): its goodbye once this replica's requests are done. */
  share: 8,
  /** The router's components (assemble.ts), after every listener has drained. */
  parts: 9,
} as const;

interface Entry {
  readonly name: string;
  readonly rank: number;
  readonly close: CloseFn;
}

export class Lifecycle {
  readonly #entries: Entry[] = [];
  #closing: Promise<void> | null = null;

  /** Registers a started service; close() closes it once, in rank order. */
  add(name: string, rank: number, close: CloseFn): void {
    this.#entries.push({ name, rank, close });
  }

  /** Names in close order (for tests and the docs). */
  get order(): readonly string[] {
    return this.#sorted().map((e) => e.name);
  }

  /** Closes every service by rank (equal ranks concurrently); a second call returns the first one's promise. */
  close(graceMs?: number): Promise<void> {
    this.#closing ??= this.#run(graceMs);
    return this.#closing;
  }

  #sorted(): Entry[] {
    // stable: equal ranks keep registration order
    return [...this.#entries].sort((a, b) => a.rank - b.rank);
  }

  async #run(graceMs?: number): Promise<void> {
    const sorted = this.#sorted();
    for (let i = 0; i < sorted.length; ) {
      let j = i;
      while (j < sorted.length && sorted[j]!.rank === sorted[i]!.rank) j++;
      await Promise.all(sorted.slice(i, j).map((e) => e.close(graceMs)));
      i = j;
    }
  }
}
