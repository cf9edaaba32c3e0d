// Pure helpers of the relay (Flight's upstream sink, src/director/director.ts):
// usage scanning (the answer's `completion_tokens`), SSE event counting for the
// latency plugins, the error answer of an engine buffered to be rewritten into
// OpenAI's shape, and the error event a stream that fails mid-way ends with.
// No state: Flight keeps what it needs between chunks.
import { errorBody, normalizeErrorBody } from '../proxy/error-shape.js';

/** Largest upstream error body the router buffers to rewrite into the current shape. */
export const MAX_ERROR_BODY = 65536;
/** The answer's output token count, as engines write it in `usage` (the last occurrence in a chunk is the one that counts). */
const COMPLETION_TOKENS = needle('"completion_tokens":');
/** The prompt's token count, beside it in the same `usage` object. */
const PROMPT_TOKENS = needle('"prompt_tokens":');
/** An SSE event's start: counted in streamed chunks to time output tokens. */
const SSE_EVENT = Buffer.from('data:');
const SSE_DATA = 'data: ';
const SSE_DONE = '\n\ndata: [DONE]\n\n';

/** The integer after `"completion_tokens":` at `at` in `chunk`, or -1 (the number is cut by the chunk's end, or absent). */
function readCount(chunk: Buffer, at: number, name: Needle = COMPLETION_TOKENS): number {
  let i = at + name.bytes.length;
  while (i < chunk.length && chunk[i] === 32) i++;
  let n = 0;
  const start = i;
  for (; i < chunk.length; i++) {
    const c = chunk[i]!;
    if (c < 48 || c > 57) break;
    n = n * 10 + (c - 48);
  }
  return i > start && i < chunk.length && n <= 0x7fffffff ? n : -1;
}

/** Bytes at a chunk's end that lastIndexOfTail() reads itself. */
const TAIL = 512;

/** A needle for lastIndexOfTail(): its bytes and its backward Horspool shifts. */
export interface Needle {
  readonly bytes: Buffer;
  /** By byte value: how far the needle's start may move back when the byte under it is that one. */
  readonly shift: Uint8Array;
}

export function needle(text: string): Needle {
  const bytes = Buffer.from(text, 'latin1');
  const n = bytes.length;
  const shift = new Uint8Array(256).fill(n);
  // the nearest later occurrence of each byte wins (backward search: the needle's start is compared first)
  for (let k = n - 1; k >= 1; k--) shift[bytes[k]!] = k;
  return { bytes, shift };
}

/**
 * Where the last occurrence of `nd` in `chunk` starts, or -1: what
 * Buffer.lastIndexOf answers, the chunk's last TAIL bytes searched here
 * (Horspool, backwards: an answer's usage is a few dozen bytes from its end,
 * found in a few skips, with no native call), the rest of a larger chunk by
 * Buffer.lastIndexOf only when the tail holds none.
 */
export function lastIndexOfTail(chunk: Buffer, nd: Needle): number {
  const b = nd.bytes;
  const sh = nd.shift;
  const n = b.length;
  const len = chunk.length;
  const lo = len > TAIL ? len - TAIL : 0;
  const c0 = b[0];
  let i = len - n;
  while (i >= lo) {
    const c = chunk[i]!;
    if (c === c0) {
      let j = 1;
      while (j < n && chunk[i + j] === b[j]) j++;
      if (j === n) return i;
    }
    i -= sh[c]!;
  }
  // an occurrence that starts before the tail (it may end inside it)
  return lo > 0 ? chunk.lastIndexOf(b, lo - 1) : -1;
}

/** The last complete `"completion_tokens":N` count in `chunk`, or -1 (none, or cut by the chunk's end). */
export function scanCompletionTokens(chunk: Buffer): number {
  const k = lastIndexOfTail(chunk, COMPLETION_TOKENS);
  return k >= 0 ? readCount(chunk, k) : -1;
}

/** The last complete `"prompt_tokens":N` count in `chunk`, or -1 (read in the chunk that carried completion_tokens). */
export function scanPromptTokens(chunk: Buffer): number {
  const k = lastIndexOfTail(chunk, PROMPT_TOKENS);
  return k >= 0 ? readCount(chunk, k, PROMPT_TOKENS) : -1;
}

/** SSE events (`data:` starts) in `chunk`: about one token each. */
export function countSseEvents(chunk: Buffer): number {
  let n = 0;
  for (let i = chunk.indexOf(SSE_EVENT); i >= 0; i = chunk.indexOf(SSE_EVENT, i + 5)) n++;
  return n;
}

/**
 * The engine's buffered error answer (`held`: its chunks) in OpenAI's shape,
 * as a string, or the raw bytes when it is not JSON (relayed unchanged).
 */
export function errorAnswer(held: Buffer[], status: number): string | Buffer {
  const raw = held.length === 1 ? held[0]! : Buffer.concat(held);
  return normalizeErrorBody(raw.toString('utf8'), status) ?? raw;
}

/** The SSE error event (and [DONE]) a stream ends with when its engine fails after the head went out. */
export function streamFailedEvent(endpointName: string, reason: string): string {
  return SSE_DATA + errorBody(502, `upstream endpoint ${endpointName} failed mid-response: ${reason}`) + SSE_DONE;
}
