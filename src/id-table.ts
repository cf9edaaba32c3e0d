// Objects by their numeric id, for tables that gain and lose an entry per
// request (the native front end's requests in flight, flow control's waiting
// requests, the SQLite store's pending calls). A leaf module: it imports
// nothing.
//
// Why not a Map: V8 compacts a Map's hash table into a new one once its
// deleted entries fill it, which with one set and one delete per request is
// every few dozen requests. The table it leaves behind keeps its entries (so
// that live iterators can follow the move) and is garbage. Once that table
// lives in the old generation (a full GC promotes everything young, and from
// then on V8 allocates the replacement tables there too), every discarded
// table is an old-to-young root until the next full GC: each scavenge copies
// the requests it held, with all they reference, and promotes them. Measured
// on the router (bench/RESULTS.md, 2026-12-04 "GC"): after the first full GC
// under load, ~1.2 KB a request survived every scavenge (40x the usual),
// scavenges paused 4-11 ms, GC cost ~1.6 us a request against ~0.2, for the
// rest of the process's life. This table is one array that is only
// rewritten in place (linear probing, backward-shift delete: no tombstones),
// and the array a growth replaces is cleared first.

/** What the table keys on: a numeric id that does not change while the object is in it. */
export interface HasId {
  readonly id: number;
}

export class IdTable<T extends HasId> {
  #slots: (T | undefined)[];
  #mask: number;
  #size = 0;

  /** `capacity`: slots to start with (rounded up to a power of two, at least 16); the table doubles at half full. */
  constructor(capacity = 64) {
    let n = 16;
    while (n < capacity) n *= 2;
    this.#slots = new Array<T | undefined>(n).fill(undefined);
    this.#mask = n - 1;
  }

  get size(): number {
    return this.#size;
  }

  get(id: number): T | undefined {
    const s = this.#slots;
    const m = this.#mask;
    for (let i = id & m; ; i = (i + 1) & m) {
      const x = s[i];
      if (x === undefined || x.id === id) return x;
    }
  }

  has(id: number): boolean {
    return this.get(id) !== undefined;
  }

  /** Adds `x` under `x.id`; an object already there under that id is replaced. */
  set(x: T): void {
    if ((this.#size + 1) * 2 > this.#slots.length) this.#grow();
    const s = this.#slots;
    const m = this.#mask;
    const id = x.id;
    for (let i = id & m; ; i = (i + 1) & m) {
      const y = s[i];
      if (y === undefined) {
        s[i] = x;
        this.#size++;
        return;
      }
      if (y.id === id) {
        s[i] = x;
        return;
      }
    }
  }

  /** Removes the object under `id`; false when there is none. */
  delete(id: number): boolean {
    const s = this.#slots;
    const m = this.#mask;
    let i = id & m;
    for (;;) {
      const x = s[i];
      if (x === undefined) return false;
      if (x.id === id) break;
      i = (i + 1) & m;
    }
    // backward shift: pull later entries of the probe run into the hole when their home slot allows it
    for (let j = (i + 1) & m; ; j = (j + 1) & m) {
      const y = s[j];
      if (y === undefined) break;
      const home = y.id & m;
      // y stays when its home lies cyclically in (i, j]
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      s[i] = y;
      i = j;
    }
    s[i] = undefined;
    this.#size--;
    return true;
  }

  /** The objects in the table, in no particular order (a new array: not for the request path). */
  values(): T[] {
    const out: T[] = [];
    for (const x of this.#slots) if (x !== undefined) out.push(x);
    return out;
  }

  /** Removes every object. */
  clear(): void {
    this.#slots.fill(undefined);
    this.#size = 0;
  }

  #grow(): void {
    const old = this.#slots;
    const n = old.length * 2;
    const s = new Array<T | undefined>(n).fill(undefined);
    const m = n - 1;
    for (const x of old) {
      if (x === undefined) continue;
      let i = x.id & m;
      while (s[i] !== undefined) i = (i + 1) & m;
      s[i] = x;
    }
    // the replaced array may already be old: left full, it would keep its objects through scavenges
    old.fill(undefined);
    this.#slots = s;
    this.#mask = m;
  }
}
