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

export class BodyScanner {
  readonly #meta = new Int32Array(SCAN_META_INTS);

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
    const body = fieldsOf(raw, meta);
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
function fieldsOf(raw: Buffer, meta: Int32Array): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const n = meta[1]!;
  for (let i = 0, m = 2; i < n; i++, m += 5) {
    const kb = meta[m]!;
    const ke = meta[m + 1]!;
    const vb = meta[m + 2]!;
    const ve = meta[m + 3]!;
    const flags = meta[m + 4]!;
    const key = (flags & SCAN_KEY_ESCAPED) !== 0 ? (JSON.parse(raw.toString('utf8', kb - 1, ke + 1)) as string) : raw.toString('utf8', kb, ke);
    if (key === '__proto__') continue; // never an object's prototype
    switch (flags & SCAN_TYPE_MASK) {
      case SCAN_STRING:
        out[key] = (flags & SCAN_VALUE_ESCAPED) !== 0 ? JSON.parse(raw.toString('utf8', vb, ve)) : raw.toString('utf8', vb + 1, ve - 1);
        break;
      case SCAN_NUMBER:
        out[key] = Number(raw.toString('latin1', vb, ve)); // the JSON grammar's numbers convert as JSON.parse converts them
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
