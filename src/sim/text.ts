// Deterministic generated text. Every generated token is exactly 4 ASCII bytes
// (a space and a consonant-vowel-consonant syllable), so countTokens() of the
// completion text equals completion_tokens, and no JSON escaping is needed.

const CONSONANTS = 'bdfgklmnprstvz';
const VOWELS = 'aeiou';

/** The 980 syllables tokens are drawn from. */
export const WORDS: readonly string[] = (() => {
  const out: string[] = [];
  for (const a of CONSONANTS) for (const v of VOWELS) for (const b of CONSONANTS) out.push(' ' + a + v + b);
  return out;
})();

/** A 32-bit integer mix (xorshift-multiply), good enough to spread seeds. */
export function mix32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d);
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
}

/** Token i of the completion seeded by `seed`. */
export function word(seed: number, i: number): string {
  return WORDS[mix32((seed + Math.imul(i + 1, 0x9e3779b9)) | 0) % WORDS.length]!;
}

/** Tokens [from, to) concatenated. */
export function words(seed: number, from: number, to: number): string {
  let s = '';
  for (let i = from; i < to; i++) s += word(seed, i);
  return s;
}

/** A seeded PRNG in [0,1) (mulberry32). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
