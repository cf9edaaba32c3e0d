// Tokenizers for precise prefix matching: the router needs the prompt's token
// ids the way the engine computes them, as little-endian uint32 bytes (what
// the precise index hashes, block by block). Three implementations:
//   SimTokenizer     the simulator's tokenizer (src/sim/tokenizer.ts): exact, in process, synchronous
//   EngineTokenizer  the engine's own POST /tokenize (vLLM serves it for prompts and chat messages)
//   HfTokenizer      a Hugging Face tokenizer.json + chat template from a local directory, in a
//                    piscina worker pool (hf-tokenizer.ts)
// TokenSource (source.ts) picks one per model, caches, times out and counts.
import { renderChat, type ChatMessage } from '../sim/tokenizer.js';

/** What a tokenizer gets: a chat (messages) or a completion (prompt: string or token ids). */
export interface TokenizeInput {
  model: string;
  messages?: unknown;
  prompt?: unknown;
}

export interface Tokenizer {
  readonly type: string;
  /** The prompt's token ids as little-endian uint32 bytes; null when the input cannot be tokenized. */
  tokenize(input: TokenizeInput, signal?: AbortSignal): Uint8Array | null | Promise<Uint8Array | null>;
  close?(): Promise<void> | void;
}

/** Token ids (numbers) to little-endian uint32 bytes. */
export function idsToBytes(ids: ArrayLike<number>): Uint8Array | null {
  const out = new Uint32Array(ids.length);
  for (let i = 0; i < ids.length; i++) {
    const v = ids[i]!;
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) return null;
    out[i] = v;
  }
  return new Uint8Array(out.buffer);
}

/**
 * The simulator's tokenizer: token i is the prompt's UTF-8 bytes [4i, 4i+4)
 * read as a little-endian uint32, chat rendered with the simulator's template;
 * so the token bytes of a text prompt are its UTF-8 bytes (zero-padded to a
 * multiple of 4). Token-id prompts are taken as they are.
 */
export class SimTokenizer implements Tokenizer {
  readonly type = 'sim';

  tokenize(input: TokenizeInput): Uint8Array | null {
    if (input.messages !== undefined) {
      if (!Array.isArray(input.messages) || input.messages.length === 0) return null;
      return textBytes(renderChat(input.messages as ChatMessage[]));
    }
    let p = input.prompt;
    if (Array.isArray(p) && p.length === 1 && (typeof p[0] === 'string' || Array.isArray(p[0]))) p = p[0];
    if (typeof p === 'string') return textBytes(p);
    if (Array.isArray(p) && p.length > 0) return idsToBytes(p as number[]);
    return null;
  }
}

function textBytes(s: string): Uint8Array {
  const b = Buffer.from(s, 'utf8');
  const pad = (4 - (b.length & 3)) & 3;
  if (pad === 0) return b;
  const out = Buffer.alloc(b.length + pad);
  b.copy(out);
  return out;
}

/**
 * The engine's POST /tokenize (vLLM: {model, prompt} or {model, messages} → {tokens: [...]}).
 * `url()` names the engine to ask (a healthy endpoint of the model's pool).
 */
export class EngineTokenizer implements Tokenizer {
  readonly type = 'engine';
  readonly #url: (model: string) => string | null;

  constructor(url: (model: string) => string | null) {
    this.#url = url;
  }

  async tokenize(input: TokenizeInput, signal?: AbortSignal): Promise<Uint8Array | null> {
    const base = this.#url(input.model);
    if (base === null) return null;
    const body = input.messages !== undefined ? { model: input.model, messages: input.messages } : { model: input.model, prompt: input.prompt };
    const r = await fetch(base + '/tokenize', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal });
    if (r.status !== 200) {
      await r.arrayBuffer().catch(() => undefined);
      throw new Error(`POST /tokenize answered ${r.status}`);
    }
    const j = (await r.json()) as { tokens?: unknown };
    if (!Array.isArray(j.tokens)) throw new Error('POST /tokenize: no tokens in the answer');
    return idsToBytes(j.tokens as number[]);
  }
}
