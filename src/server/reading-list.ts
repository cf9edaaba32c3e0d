// Lists of requests with O(1) add and delete through an index kept on each
// request: the requests still reading their body (the 408 sweep walks it) and,
// in drain.ts, the requests in flight.

/**
 * An array with swap-remove through the slot field `key` of each item (-1:
 * not in the list). A Set would rehash as it grows and shrinks with every
 * request; this allocates nothing per request.
 */
export class SlotList<K extends string, T extends Record<K, number>> {
  protected readonly items: T[] = [];
  readonly #key: K;

  constructor(key: K) {
    this.#key = key;
  }

  get size(): number {
    return this.items.length;
  }

  add(r: T): void {
    if (r[this.#key] >= 0) return;
    (r as Record<K, number>)[this.#key] = this.items.length;
    this.items.push(r);
  }

  delete(r: T): void {
    const i = r[this.#key];
    if (i < 0) return;
    (r as Record<K, number>)[this.#key] = -1;
    const last = this.items.pop()!;
    if (last !== r) {
      this.items[i] = last;
      (last as Record<K, number>)[this.#key] = i;
    }
  }

  has(r: T): boolean {
    const i = r[this.#key];
    return i >= 0 && this.items[i] === r;
  }
}

/** What the 408 sweep needs of a request still reading its body (HttpExchange). */
export interface ReadingRequest {
  readSlot: number;
  /** The sweep clock when its body reading began. */
  readonly readStart: number;
  /** Answers with `status` and ends the request. */
  reject(status: number, message: string): void;
}

/** The requests still reading their body. */
export class ReadingList extends SlotList<'readSlot', ReadingRequest> {
  constructor() {
    super('readSlot');
  }

  /** Those whose body reading began before `deadline` (a new array: the sweep is not on the request path). */
  startedBefore(deadline: number): ReadingRequest[] {
    return this.items.filter((r) => r.readStart < deadline);
  }
}
