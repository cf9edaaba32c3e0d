// Request bodies' memory, reused (issue 37). A long prompt's body is a
// buffer of its own per request (400 KB at 100k tokens), and V8 counts every
// such buffer against its external-memory budget: at a thousand such requests
// a second the old generation was marked and compacted every ~50 ms
// (node --trace-gc, bench/system/long-prompt.ts), a fifth of the router's CPU.
// The front ends take a body's buffer here and the request's Flight gives it
// back when it has ended (nothing reads the client's bytes after that: see
// Flight.finish), so a steady stream of long prompts allocates nothing.
//
// Buffers come in power-of-two classes from 4 KiB to 4 MiB; other sizes are
// plain allocations that give() ignores. A buffer is handed out at most once
// until it is given back (a second give of it, or of a buffer that did not
// come from here, does nothing), so two requests can never share one. What the
// free lists keep is bounded (maxFreeBytes); a buffer never given back (a body
// that went to a worker, the Responses API or the batch path keeps its own) is
// simply collected.
const MIN_SHIFT = 12;
const MAX_SHIFT = 22;

function classOf(n: number): number {
  return n <= 1 << MIN_SHIFT ? MIN_SHIFT : 32 - Math.clz32(n - 1);
}

export class BodyPool {
  /** Per class shift: free whole buffers of 1 << shift bytes. */
  readonly #free: Buffer[][] = [];
  /** Handed out and not yet given back: each one's ArrayBuffer → its whole buffer. */
  readonly #out = new WeakMap<ArrayBufferLike, Buffer>();
  readonly #maxFreeBytes: number;
  #freeBytes = 0;
  /** Buffers allocated because no free one of their class was there (a test and a bench read it). */
  allocated = 0;

  constructor(maxFreeBytes = 32 << 20) {
    this.#maxFreeBytes = maxFreeBytes;
    for (let s = 0; s <= MAX_SHIFT; s++) this.#free.push([]);
  }

  /** The largest body a pooled buffer holds. */
  static get maxBytes(): number {
    return 1 << MAX_SHIFT;
  }

  /** A buffer of `n` bytes (its contents are not cleared: the caller fills all of them). */
  take(n: number): Buffer {
    if (n < 1 << MIN_SHIFT || n > 1 << MAX_SHIFT) return Buffer.allocUnsafe(n);
    const s = classOf(n);
    let whole = this.#free[s]!.pop();
    if (whole === undefined) {
      whole = Buffer.allocUnsafeSlow(1 << s);
      this.allocated++;
    } else this.#freeBytes -= whole.length;
    this.#out.set(whole.buffer, whole);
    return whole.length === n ? whole : whole.subarray(0, n);
  }

  /** Gives back a buffer take() returned (or a view of one); anything else is ignored. */
  give(b: Uint8Array): void {
    const whole = this.#out.get(b.buffer);
    if (whole === undefined) return;
    this.#out.delete(b.buffer);
    if (this.#freeBytes + whole.length > this.#maxFreeBytes) return; // the collector takes it
    this.#freeBytes += whole.length;
    this.#free[classOf(whole.length)]!.push(whole);
  }

  /** Bytes the free lists keep. */
  get freeBytes(): number {
    return this.#freeBytes;
  }
}
