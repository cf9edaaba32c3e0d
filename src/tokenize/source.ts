// The router's token source for precise prefix matching: which tokenizer a
// model uses (its pool's `prefix.tokenizer`), a cache of tokenized prompts
// keyed by the prompt's chained block hashes (one native hash call over the
// router's rendered prompt bytes: a repeated prompt is never tokenized twice),
// a timeout, and counters. A tokenizer that fails, is slow, or cannot take the
// input yields null: the request is then scored by the approximate mode
// (counted). The director starts tokenization when admission starts and
// awaits it before the pick, never inside it (docs/prefix-index.md).
import { PrefixIndex } from '../../bindings/index.js';
import type { Tokenizer, TokenizeInput } from './tokenizer.js';

export interface ModelTokenizer {
  tokenizer: Tokenizer;
  timeoutMs: number;
  cacheEntries: number;
}

export class TokenCounters {
  /** Prompts tokenized synchronously / asynchronously / answered from the cache. */
  sync = 0;
  async = 0;
  cacheHits = 0;
  /** Fell back to approximate scoring: timed out, failed, or not tokenizable. */
  timeouts = 0;
  failures = 0;
  untokenizable = 0;
}

const KEY_BLOCK = 64;

export class TokenSource {
  readonly counters = new TokenCounters();
  readonly #byModel: Map<string, ModelTokenizer>;
  readonly #cache = new Map<string, Uint8Array>();
  readonly #maxCache: number;
  readonly #hasher = new PrefixIndex({ blockSize: KEY_BLOCK, maxEndpoints: 1 });
  #hashes = new BigUint64Array(1024);

  constructor(byModel: Map<string, ModelTokenizer>) {
    this.#byModel = byModel;
    let max = 0;
    for (const m of byModel.values()) max = Math.max(max, m.cacheEntries);
    this.#maxCache = max;
  }

  /** Whether requests for `model` are tokenized (their pool is precise). */
  has(model: string): boolean {
    return this.#byModel.has(model);
  }

  /**
   * The prompt's tokens: bytes now, a promise of them (never rejects: null on timeout or failure), or
   * null. `promptBytes` are the router's rendered prompt (the cache key is hashed from them).
   */
  tokens(input: TokenizeInput, promptBytes: Uint8Array): Uint8Array | null | Promise<Uint8Array | null> {
    const m = this.#byModel.get(input.model);
    if (m === undefined) return null;
    const c = this.counters;
    const t = m.tokenizer;
    let key: string | null = null;
    if (this.#maxCache > 0 && t.type !== 'sim') {
      key = this.#key(input.model, promptBytes);
      const hit = this.#cache.get(key);
      if (hit !== undefined) {
        c.cacheHits++;
        this.#cache.delete(key);
        this.#cache.set(key, hit);
        return hit;
      }
    }
    let r: Uint8Array | null | Promise<Uint8Array | null>;
    const ac = t.type === 'sim' ? undefined : new AbortController();
    try {
      r = t.tokenize(input, ac?.signal);
    } catch {
      c.failures++;
      return null;
    }
    if (!(r instanceof Promise)) {
      c.sync++;
      if (r === null) c.untokenizable++;
      else if (key !== null) this.#put(key, r);
      return r;
    }
    c.async++;
    return new Promise<Uint8Array | null>((resolve) => {
      const timer = setTimeout(() => {
        c.timeouts++;
        ac?.abort();
        resolve(null);
      }, m.timeoutMs);
      (r as Promise<Uint8Array | null>).then(
        (v) => {
          clearTimeout(timer);
          if (v === null) c.untokenizable++;
          else if (key !== null) this.#put(key, v);
          resolve(v);
        },
        () => {
          if (ac?.signal.aborted) return; // the timeout already answered
          clearTimeout(timer);
          c.failures++;
          resolve(null);
        },
      );
    });
  }

  #key(model: string, p: Uint8Array): string {
    const n = Math.floor(p.length / KEY_BLOCK);
    if (this.#hashes.length < n) this.#hashes = new BigUint64Array(n * 2);
    const tail = Buffer.from(p.buffer, p.byteOffset + n * KEY_BLOCK, p.length - n * KEY_BLOCK).toString('latin1');
    if (n === 0) return model + '\0' + tail;
    this.#hasher.hashPrompt(p, PrefixIndex.seedFor(model), this.#hashes);
    return model + '\0' + this.#hashes[n - 1]!.toString(36) + '\0' + tail;
  }

  #put(key: string, v: Uint8Array): void {
    this.#cache.set(key, v);
    if (this.#cache.size > this.#maxCache) this.#cache.delete(this.#cache.keys().next().value as string);
  }

  async close(): Promise<void> {
    const seen = new Set<Tokenizer>();
    for (const m of this.#byModel.values()) {
      if (seen.has(m.tokenizer)) continue;
      seen.add(m.tokenizer);
      await m.tokenizer.close?.();
    }
  }
}
