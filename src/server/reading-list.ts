// The requests still reading their body (the 408 sweep walks it).
import type { HttpExchange } from './http-exchange.js';

/**
 * The requests still reading their body: an array with swap-remove through an
 * index kept on each request. A Set would rehash as it grows and shrinks with
 * every request; this allocates nothing per request.
 */
export class ReadingList {
  readonly #items: HttpExchange[] = [];

  get size(): number {
    return this.#items.length;
  }

  add(r: HttpExchange): void {
    if (r.readSlot >= 0) return;
    r.readSlot = this.#items.length;
    this.#items.push(r);
  }

  delete(r: HttpExchange): void {
    const i = r.readSlot;
    if (i < 0) return;
    r.readSlot = -1;
    const last = this.#items.pop()!;
    if (last !== r) {
      this.#items[i] = last;
      last.readSlot = i;
    }
  }

  has(r: HttpExchange): boolean {
    return r.readSlot >= 0 && this.#items[r.readSlot] === r;
  }

  /** Those whose body reading began before `deadline` (a new array: the sweep is not on the request path). */
  startedBefore(deadline: number): HttpExchange[] {
    return this.#items.filter((r) => r.readStart < deadline);
  }
}
