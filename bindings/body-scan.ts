// The request-body scanner (native/body_scan.h): one native call validates an
// inference body as JSON with the nesting bound, lists its top-level members
// and renders the prompt the prefix index matches on.
import { native } from './native.js';

/** Scanned and rendered: the prompt's length is meta[0], the members follow. */
export const SCAN_OK = 0;
/** Not sure (invalid JSON, too deep, a semantic error, too many members): parse in JavaScript for the exact answer. */
export const SCAN_FALLBACK = 1;
/** `out` too small: meta[0] is the size needed. */
export const SCAN_OUT_TOO_SMALL = 2;

/** Member flags (meta[2 + 5i + 4]): the low 3 bits are the value's type. */
export const SCAN_TYPE_MASK = 7;
export const SCAN_STRING = 1;
export const SCAN_NUMBER = 2;
export const SCAN_TRUE = 3;
export const SCAN_FALSE = 4;
export const SCAN_NULL = 5;
export const SCAN_OBJECT = 6;
export const SCAN_ARRAY = 7;
export const SCAN_KEY_ESCAPED = 8;
export const SCAN_VALUE_ESCAPED = 16;
export const SCAN_INCLUDE_USAGE = 32;
/** Ints a meta array needs: two, then five per member for up to 256 members. */
export const SCAN_META_INTS = 2 + 256 * 5;

/**
 * Scans `body` (a request of `kind`: 0 chat, 1 completions, others no prompt),
 * rendering the prompt into `out`; returns SCAN_OK, SCAN_FALLBACK or
 * SCAN_OUT_TOO_SMALL. `meta`: an Int32Array of SCAN_META_INTS.
 */
export function scanRequestBody(body: Uint8Array, kind: number, maxDepth: number, out: Uint8Array, meta: Int32Array): number {
  return native.scanRequestBody(body, kind, maxDepth, out, meta) as number;
}
