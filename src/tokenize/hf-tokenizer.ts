// The Hugging Face tokenizer: tokenizer.json + chat template from a local
// model directory, run in a piscina worker pool (hf-worker.ts) so the event
// loop never tokenizes. Library choice: @huggingface/tokenizers (pure JS, no
// native build, no runtime dependencies, works on Node 20; the same
// implementation transformers.js uses) and @huggingface/jinja (the chat-template
// engine transformers.js uses, Node >= 18) — the maintained choices for the
// tokenizer.json format; a hand-written BPE loader would cover one model family
// at a time (byte-level BPE, SentencePiece/Unigram, WordPiece differ).
import { Piscina } from 'piscina';
import type { HfTask } from './hf-worker.js';
import { idsToBytes, type Tokenizer, type TokenizeInput } from './tokenizer.js';

let pool: Piscina<HfTask, Uint8Array> | null = null;
let users = 0;

export class HfTokenizer implements Tokenizer {
  readonly type = 'huggingface';
  readonly dir: string;
  #closed = false;

  constructor(dir: string, threads = 2) {
    this.dir = dir;
    users++;
    pool ??= new Piscina<HfTask, Uint8Array>({
      filename: new URL('./hf-worker.js', import.meta.url).href,
      minThreads: 1,
      maxThreads: threads,
      idleTimeout: 60_000,
    });
  }

  tokenize(input: TokenizeInput, signal?: AbortSignal): Uint8Array | null | Promise<Uint8Array | null> {
    let p = input.prompt;
    if (Array.isArray(p) && p.length === 1 && (typeof p[0] === 'string' || Array.isArray(p[0]))) p = p[0];
    // a prompt of token ids needs no tokenizer
    if (input.messages === undefined && Array.isArray(p)) return idsToBytes(p as number[]);
    if (input.messages === undefined && typeof p !== 'string') return null;
    const task: HfTask = input.messages !== undefined ? { dir: this.dir, messages: input.messages } : { dir: this.dir, prompt: p as string };
    return pool!.run(task, signal ? { signal } : {});
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (--users === 0 && pool !== null) {
      const p = pool;
      pool = null;
      await p.destroy();
    }
  }
}
