// How deeply a JSON text nests arrays and objects, checked without parsing it:
// JSON.parse costs far more than a body's size on deep nesting (~15 ms for
// 8 Ki levels, ~1.7 s and ~60 MB for 1 Mi in V8), so the router and the
// simulator refuse such bodies before parsing. A leaf module: it imports
// nothing.

const QUOTE = 34;
const BACKSLASH = 92;

/** True when `b` (JSON text) nests arrays/objects deeper than `limit`; strings are skipped. */
export function jsonNestsDeeper(b: Uint8Array, limit: number): boolean {
  // fast gate: nesting needs an opening bracket per level
  const buf = b as Buffer;
  let n = 0;
  for (let i = buf.indexOf(91); i >= 0 && n <= limit; i = buf.indexOf(91, i + 1)) n++;
  for (let i = buf.indexOf(123); i >= 0 && n <= limit; i = buf.indexOf(123, i + 1)) n++;
  if (n <= limit) return false;
  let d = 0;
  const len = buf.length;
  let i = 0;
  while (i < len) {
    const c = buf[i++];
    if (c === QUOTE) {
      // to the closing quote: one not preceded by an odd run of backslashes
      for (;;) {
        const q = buf.indexOf(QUOTE, i);
        if (q < 0) return false; // unterminated: JSON.parse will say so
        let bs = 0;
        for (let j = q - 1; j >= i && buf[j] === BACKSLASH; j--) bs++;
        i = q + 1;
        if ((bs & 1) === 0) break;
      }
    } else if (c === 91 || c === 123) {
      if (++d > limit) return true;
    } else if (c === 93 || c === 125) d--;
  }
  return false;
}
