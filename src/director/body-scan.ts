// The fast path for an inference request body (issue 37, "scan, don't
// parse"): one native call (native/body_scan.h) validates the body as JSON
// with the nesting bound, renders its prompt into the director's shared
// PromptWriter (the bytes PromptWriter.chat/completion would write from the
// parsed object, so the same block hashes) and lists its top-level members;
// this module builds from those ranges the small object of top-level scalars
// the rest of the router reads (model, stream, max_tokens, user,
// prompt_cache_key, ...; stream_options as {include_usage}). No JavaScript
// string of the prompt is made and the body is never parsed into objects.
//
// Anything the scanner is unsure of (invalid JSON, too deep, a semantic
// error, a body without model or prompt) is answered null: the caller runs
// parseRequestBody, which gives today's exact status and message.
import {
  scanRequestBody,
  SCAN_ARRAY,
  SCAN_FALSE,
  SCAN_INCLUDE_USAGE,
  SCAN_KEY_ESCAPED,
  SCAN_META_INTS,
  SCAN_NULL,
  SCAN_NUMBER,
  SCAN_OBJECT,
  SCAN_OK,
  SCAN_OUT_TOO_SMALL,
  SCAN_STRING,
  SCAN_TRUE,
  SCAN_TYPE_MASK,
  SCAN_VALUE_ESCAPED,
} from '../../bindings/body-scan.js';
import type { ParsedBody } from './body.js';
import { isPassthrough } from './kinds.js';
import type { PromptWriter } from './prompt.js';

/** Slots of the scanner's string table (a power of two). */
const STRING_SLOTS = 64;
/** Keys and values up to this many bytes go through the string table; longer ones are decoded each time. */
const STRING_MAX_BYTES = 48;

/**
 * The strings fieldsOf made lately, by their bytes: a request's keys (model,
 * max_tokens, stream, ...) and its short values (the model's name, user) are
 * mostly those of the requests before it, and a string found here is one
 * decode (Buffer#toString, ~0.1 µs) not made. A fixed table (a slot per hash
 * of the bytes, the newest wins): a client sending new names each time only
 * misses, and the table never grows.
 */
class StringTable {
  readonly #bytes = new Uint8Array(STRING_SLOTS * STRING_MAX_BYTES);
  readonly #lengths = new Int32Array(STRING_SLOTS).fill(-1);
  readonly #strings: string[] = new Array<string>(STRING_SLOTS).fill('');

  /** raw.toString('utf8', b, e). */
  utf8(raw: Buffer, b: number, e: number): string {
    const n = e - b;
    if (n > STRING_MAX_BYTES) return raw.toString('utf8', b, e);
    let h = n;
    for (let i = b; i < e; i++) h = (Math.imul(h, 31) + raw[i]!) | 0;
    const slot = (h ^ (h >>> 11)) & (STRING_SLOTS - 1);
    const at = slot * STRING_MAX_BYTES;
    const bytes = this.#bytes;
    if (this.#lengths[slot] === n) {
      let i = 0;
      while (i < n && bytes[at + i] === raw[b + i]) i++;
      if (i === n) return this.#strings[slot]!;
    }
    const s = raw.toString('utf8', b, e);
    raw.copy(bytes, at, b, e);
    this.#lengths[slot] = n;
    this.#strings[slot] = s;
    return s;
  }
}

/** A JSON number's value: a plain integer of up to 15 digits read here, any other form as JSON.parse reads it. */
function numberAt(raw: Buffer, b: number, e: number): number {
  let i = b;
  const neg = raw[i] === 0x2d;
  if (neg) i++;
  if (e - i > 15 || i === e) return Number(raw.toString('latin1', b, e));
  let v = 0;
  for (; i < e; i++) {
    const c = raw[i]! - 0x30;
    if (c < 0 || c > 9) return Number(raw.toString('latin1', b, e)); // a fraction or an exponent
    v = v * 10 + c;
  }
  return neg ? -v : v; // -0 for "-0", as JSON.parse gives
}

export class BodyScanner {
  readonly #meta = new Int32Array(SCAN_META_INTS);
  readonly #strings = new StringTable();

  /**
   * Scans `raw` (a request of `kind`), rendering its prompt into `pw`; the
   * model and the top-level scalar fields, or null when the JavaScript parse
   * must answer (pw is then empty).
   */
  scan(raw: Buffer, kind: number, pw: PromptWriter, maxDepth: number): ParsedBody | null {
    const meta = this.#meta;
    // the prompt is rarely longer than the body (escapes shrink, token ids and U+FFFD grow it)
    let st = scanRequestBody(raw, kind, maxDepth, pw.writable(raw.length + 64), meta);
    if (st === SCAN_OUT_TOO_SMALL) st = scanRequestBody(raw, kind, maxDepth, pw.writable(meta[0]!), meta);
    if (st !== SCAN_OK) {
      pw.reset();
      return null;
    }
    pw.commit(meta[0]!);
    const body = fieldsOf(raw, meta, this.#strings);
    const model = body.model;
    if (isPassthrough(kind)) {
      if (model === undefined) return { ok: true, model: '', body };
      if (typeof model !== 'string' || model.length === 0) return null;
      return { ok: true, model, body };
    }
    if (typeof model !== 'string' || model.length === 0) {
      pw.reset();
      return null;
    }
    return { ok: true, model, body };
  }
}

/**
 * The top-level members the scan listed, as JSON.parse then scalarFields would
 * give them (duplicates: the last wins; an object or array value leaves its
 * key out), plus stream_options as {include_usage: true} or {}.
 */
function fieldsOf(raw: Buffer, meta: Int32Array, strings: StringTable): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const n = meta[1]!;
  for (let i = 0, m = 2; i < n; i++, m += 5) {
    const kb = meta[m]!;
    const ke = meta[m + 1]!;
    const vb = meta[m + 2]!;
    const ve = meta[m + 3]!;
    const flags = meta[m + 4]!;
    const key = (flags & SCAN_KEY_ESCAPED) !== 0 ? (JSON.parse(raw.toString('utf8', kb - 1, ke + 1)) as string) : strings.utf8(raw, kb, ke);
    if (key === '__proto__') continue; // never an object's prototype
    switch (flags & SCAN_TYPE_MASK) {
      case SCAN_STRING:
        out[key] = (flags & SCAN_VALUE_ESCAPED) !== 0 ? JSON.parse(raw.toString('utf8', vb, ve)) : strings.utf8(raw, vb + 1, ve - 1);
        break;
      case SCAN_NUMBER:
        out[key] = numberAt(raw, vb, ve); // the JSON grammar's numbers convert as JSON.parse converts them
        break;
      case SCAN_TRUE:
        out[key] = true;
        break;
      case SCAN_FALSE:
        out[key] = false;
        break;
      case SCAN_NULL:
        out[key] = null;
        break;
      case SCAN_OBJECT:
        if (key === 'stream_options') out[key] = (flags & SCAN_INCLUDE_USAGE) !== 0 ? { include_usage: true } : {};
        else delete out[key];
        break;
      case SCAN_ARRAY:
        delete out[key];
        break;
    }
  }
  return out;
}
