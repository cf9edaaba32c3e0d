// Rewrites mid-stream error events of an engine's SSE answer into OpenAI's
// shape (`data: {"error":{...}}`, string/null code, OpenAI's type), for a
// stream relayed chunk by chunk: older vLLM's flat shape
// (`data: {"object":"error","message",...}`) and the nested shape with an
// integer code and a class-name type (current vLLM, SGLang).
//
// The scan is linear in the bytes relayed whatever the engine sends: each
// chunk is searched once for event ends ("\n\n"), each event start is compared
// against fixed markers (23 bytes at most), and a tail that may be an incomplete error
// event is held (bounded by MAX_EVENT) and searched only in the bytes that
// arrive after it. Token events, the common case, pass without a copy.
//
// SSE lines may end in LF, CRLF or a lone CR (an engine that ends them in CRLF
// would otherwise never show an event end). A chunk with a CR in it is
// relayed with its line ends as LF (a copy, for such engines only); a CR at a
// chunk's end is taken as a line end at once and an LF that starts the next
// chunk is then its second half, dropped. Chunks without a CR (vLLM, SGLang)
// pass as before: one native search for a CR more per chunk.
import { normalizeErrorBody } from './error-shape.js';

/** Every error event starts so; then `o` (the flat shape) or `e` (`{"error":...}`, rewritten when its code is an integer or its type a class name). */
const PREFIX = Buffer.from('data: {"');
const FLAT = Buffer.from('data: {"object":"error"');
const NESTED = Buffer.from('data: {"error":');
const DATA = Buffer.from('data: ');
const END = Buffer.from('\n\n');
/** Largest event held to be rewritten; a longer one is relayed as it is. */
export const MAX_EVENT = 65536;

const NO = 0;
const YES = 1;
const MAYBE = 2;

/** Does the event starting at `s` begin with an error marker? MAYBE: the chunk ends inside the marker. */
function flatAt(b: Buffer, s: number): number {
  const k = Math.min(PREFIX.length, b.length - s);
  if (b.compare(PREFIX, 0, k, s, s + k) !== 0) return NO;
  if (k < PREFIX.length || s + k === b.length) return MAYBE;
  const c = b[s + k];
  const m = c === 0x6f ? FLAT : c === 0x65 ? NESTED : null;
  if (m === null) return NO;
  const k2 = Math.min(m.length, b.length - s);
  if (b.compare(m, 0, k2, s, s + k2) !== 0) return NO;
  return k2 === m.length ? YES : MAYBE;
}

export class SseErrorRewriter {
  /** Held pieces of an event that may be a flat error event (it began at an event start). */
  #hold: Buffer[] = [];
  #holdLen = 0;
  /** The next byte relayed begins an event. */
  #atStart = true;
  /** Outside a held event: the last byte relayed was '\n' (a "\n\n" may straddle two chunks). */
  #lastNl = false;
  /** The last chunk ended in a CR (relayed as LF): an LF at the start of the next is its CRLF's second half. */
  #crPending = false;

  /** The bytes to relay now for `chunk` (maybe none). `chunk` may be reused by its owner after this returns. */
  push(input: Buffer): Buffer {
    const chunk = this.#lf(input);
    if (this.#holdLen > 0) return this.#pushHeld(chunk);
    const n = chunk.length;
    if (n === 0) return chunk;
    let s: number;
    if (this.#atStart) s = 0;
    else if (this.#lastNl && chunk[0] === 10) s = 1;
    else {
      const e = chunk.indexOf(END);
      if (e < 0) {
        this.#lastNl = chunk[n - 1] === 10;
        return chunk;
      }
      s = e + 2;
    }
    return this.#events(chunk, s);
  }

  /** `b` with its line ends (CRLF, lone CR) as LF: `b` itself when it has no CR. */
  #lf(b: Buffer): Buffer {
    if (this.#crPending) {
      this.#crPending = false;
      if (b.length > 0 && b[0] === 10) b = b.subarray(1);
    }
    let i = b.indexOf(13);
    if (i < 0) return b;
    const n = b.length;
    const out = Buffer.allocUnsafe(n);
    b.copy(out, 0, 0, i);
    let j = i;
    for (; i < n; i++) {
      const c = b[i]!;
      if (c !== 13) {
        out[j++] = c;
        continue;
      }
      out[j++] = 10;
      if (i + 1 === n) this.#crPending = true;
      else if (b[i + 1] === 10) i++;
    }
    return out.subarray(0, j);
  }

  /** At the end of the stream: what is still held (rewritten when it is a complete error event), or null. */
  flush(): Buffer | null {
    if (this.#holdLen === 0) return null;
    const held = this.#take();
    const fixed = held.length >= 2 && held[held.length - 1] === 10 && held[held.length - 2] === 10 ? this.#rewriteOne(held, 0, held.length - 2) : null;
    return fixed === null ? held : Buffer.concat([fixed, END]);
  }

  /** Walks the events of `b` from the event start `s` on (bytes before `s` belong to an event already relayed). */
  #events(b: Buffer, s: number): Buffer {
    const n = b.length;
    let parts: Buffer[] | null = null;
    let from = 0;
    while (s < n) {
      const kind = flatAt(b, s);
      const e = kind === NO ? -1 : b.indexOf(END, s);
      if (kind !== NO && e >= 0) {
        const fixed = this.#rewriteOne(b, s, e);
        if (fixed !== null) {
          (parts ??= []).push(b.subarray(from, s), fixed);
          from = e; // the "\n\n" stays
        }
        s = e + 2;
        continue;
      }
      if (kind !== NO && n - s <= MAX_EVENT) {
        // an error event (or the start of one) not complete yet: hold it (a copy: the chunk's memory may be reused)
        this.#hold.push(Buffer.from(b.subarray(s)));
        this.#holdLen = n - s;
        this.#atStart = true;
        return this.#out(b, parts, from, s);
      }
      // not an error event (or too long to be one): skip to its end
      const end = kind === NO ? b.indexOf(END, s) : -1;
      if (end < 0) {
        this.#atStart = false;
        this.#lastNl = b[n - 1] === 10;
        return this.#out(b, parts, from, n);
      }
      s = end + 2;
    }
    this.#atStart = true;
    this.#lastNl = false;
    return this.#out(b, parts, from, n);
  }

  /** While holding: looks for the held event's end only in the new bytes (linear over a trickled event). */
  #pushHeld(chunk: Buffer): Buffer {
    const lastHeld = this.#hold[this.#hold.length - 1]!;
    const straddle = lastHeld[lastHeld.length - 1] === 10 && chunk.length > 0 && chunk[0] === 10;
    const ends = straddle || chunk.indexOf(END) >= 0;
    // the marker itself is 23 bytes: until they are all here, the held bytes may still not be an error event
    if (!ends && this.#holdLen >= FLAT.length && this.#holdLen + chunk.length <= MAX_EVENT) {
      this.#hold.push(Buffer.from(chunk));
      this.#holdLen += chunk.length;
      return EMPTY;
    }
    if (!ends && this.#holdLen + chunk.length > MAX_EVENT) {
      // too long for an error event: relay all of it as it is, and carry on in the middle of that event
      const all = Buffer.concat([this.#take(), chunk]);
      this.#atStart = false;
      this.#lastNl = all[all.length - 1] === 10;
      return all;
    }
    // the held event ends in this chunk, or its first bytes need another look: walk it again from its start
    const all = Buffer.concat([this.#take(), chunk]);
    return this.#events(all, 0);
  }

  #take(): Buffer {
    const held = this.#hold.length === 1 ? this.#hold[0]! : Buffer.concat(this.#hold, this.#holdLen);
    this.#hold = [];
    this.#holdLen = 0;
    return held;
  }

  /** The event b[s, e) (`data: {...}`) in the current shape, or null to relay it unchanged. */
  #rewriteOne(b: Buffer, s: number, e: number): Buffer | null {
    const fixed = normalizeErrorBody(b.toString('utf8', s + DATA.length, e), 500);
    return fixed === null ? null : Buffer.from(`data: ${fixed}`);
  }

  #out(b: Buffer, parts: Buffer[] | null, from: number, to: number): Buffer {
    if (parts === null) return from === 0 && to === b.length ? b : b.subarray(from, to);
    parts.push(b.subarray(from, to));
    return Buffer.concat(parts);
  }
}

const EMPTY = Buffer.alloc(0);
